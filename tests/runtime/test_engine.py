"""The engine end to end on a tiny random checkpoint: exact against transformers, and its bookkeeping."""

import pytest

from compress.errors import UserError
from compress.runtime import SamplingParams
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import GREEDY, assert_logprobs_equal, hf_greedy, make_llm, random_prompts, run_requests



def test_greedy_equals_transformers_generate(tiny_dir, prompts, expected):
    llm = make_llm(tiny_dir)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert all(o.finished and o.finish_reason == "length" for o in outs)
    assert llm.blocks.num_free == llm.blocks.num_blocks


def test_small_pool_and_budget_preempt_and_chunk_but_give_the_same_tokens(tiny_dir, prompts, expected):
    # 8 blocks hold 128 tokens; the five requests need 305 at once. A 32-token budget chunks the long prompts.
    llm = make_llm(tiny_dir, blocks=8, max_num_batched_tokens=32)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert llm.scheduler.num_preemptions > 0
    assert llm.blocks.num_free == llm.blocks.num_blocks


def test_shared_prefix_blocks_are_allocated_once(tiny_dir):
    prefix, *suffixes = random_prompts([200, 20, 20, 20, 20], 49152, seed=3)
    prompts = [prefix + s for s in suffixes]
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    outputs = {}
    for caching in (True, False):
        llm = make_llm(tiny_dir, enable_prefix_caching=caching)
        first = llm.add_request(prompts[0], params)
        llm.step()  # the first request's prompt is computed and its full blocks registered
        rest = [llm.add_request(p, params) for p in prompts[1:]]
        done = {}
        while llm.has_unfinished():
            done.update((o.request_id, o.token_ids) for o in llm.step() if o.finished)
        outputs[caching] = [done[i] for i in [first, *rest]]
        # 220 prompt + 7 computed output tokens = 15 blocks each; the 12 blocks of pure prefix are shared,
        # and so are the 8 prefix tokens in block 12 (each copy of it replaces a fresh block).
        assert llm.blocks.num_allocated == (15 + 3 * 3 if caching else 4 * 15)
        assert llm.blocks.num_prefix_hits == (3 * 13 if caching else 0)
        assert llm.blocks.num_partial_hits == (3 if caching else 0)
        assert llm.blocks.num_cow_copies == (3 if caching else 0)
        assert llm.blocks.num_free == llm.blocks.num_blocks
    assert outputs[True] == outputs[False]


def test_identical_prompt_shares_every_block_and_copies_on_write(tiny_dir, hf_tiny):
    prompt = random_prompts([32], 49152, seed=4)[0]
    llm = make_llm(tiny_dir)
    a = llm.add_request(prompt, GREEDY)
    llm.step()
    b = llm.add_request(prompt, GREEDY)
    done = {}
    while llm.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in llm.step() if o.finished)
    assert done[a] == done[b] == hf_greedy(hf_tiny, prompt, GREEDY.max_tokens)
    assert llm.blocks.num_prefix_hits == 2 and llm.blocks.num_cow_copies == 1


def test_seeded_sampling_is_the_same_alone_and_in_a_busy_batch(tiny_dir, prompts):
    params = SamplingParams(max_tokens=16, temperature=0.8, top_p=0.9, top_k=100, seed=1234, ignore_eos=True)
    alone = make_llm(tiny_dir).generate(prompts[1], params)[0].token_ids
    llm = make_llm(tiny_dir, blocks=10, max_num_batched_tokens=48)
    others = [SamplingParams(max_tokens=20, temperature=1.0, ignore_eos=True), GREEDY]
    for i, p in enumerate(prompts):
        llm.add_request(p, others[i % 2])
    busy = llm.generate(prompts[1], params)[0].token_ids
    assert busy == alone
    assert llm.scheduler.num_preemptions > 0
    reseeded = make_llm(tiny_dir).generate(prompts[1], SamplingParams(**{**vars(params), "seed": 99}))[0].token_ids
    assert reseeded != alone


def test_abort_frees_every_block(tiny_dir, prompts):
    llm = make_llm(tiny_dir)
    ids = [llm.add_request(p, GREEDY) for p in prompts]
    for _ in range(3):
        llm.step()
    held = {i: len(llm.requests[i].block_table) for i in ids}
    llm.abort(ids[2])
    assert llm.blocks.num_free == llm.blocks.num_blocks - sum(n for i, n in held.items() if i != ids[2])
    for i in ids:
        llm.abort(i)
    llm.abort(12345)  # unknown ids are ignored
    assert not llm.has_unfinished() and llm.blocks.num_free == llm.blocks.num_blocks


def test_bad_requests_fail_alone_and_the_engine_keeps_serving(tiny_dir, prompts, expected):
    llm = make_llm(tiny_dir, blocks=6)
    good = llm.add_request(prompts[1], GREEDY)
    llm.step()
    bad = [("", "empty"), ([], "empty"), ([1] * 256, "context"), ([49152], "token ids")]  # the context is 256
    for prompt, fragment in bad:
        with pytest.raises(UserError, match=fragment):
            llm.add_request(prompt, GREEDY)
    with pytest.raises(UserError, match="KV blocks"):
        llm.add_request(prompts[4], SamplingParams(max_tokens=30, temperature=0))  # 100 tokens > 6 blocks
    with pytest.raises(UserError, match="top_p"):
        llm.add_request(prompts[0], SamplingParams(top_p=0))
    with pytest.raises(UserError, match="empty"):
        llm.generate([prompts[0], ""], GREEDY)  # nothing of a bad batch is queued
    out = {}
    while llm.has_unfinished():
        out.update((o.request_id, o.token_ids) for o in llm.step() if o.finished)
    assert out == {good: expected[1]}
    assert llm.blocks.num_free == llm.blocks.num_blocks


def test_stream_and_stop_strings(tiny_dir):
    llm = make_llm(tiny_dir)
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True)
    full = llm.generate("Hello world", params)[0]
    assert "".join(llm.stream("Hello world", params)) == full.text
    stop = full.text[5:8]
    cut = llm.generate("Hello world", SamplingParams(**{**vars(params), "stop": stop}))[0]
    assert cut.finish_reason == "stop" and cut.text == full.text[: full.text.find(stop)]
    assert "".join(llm.stream("Hello world", SamplingParams(**{**vars(params), "stop": stop}))) == cut.text


def test_sliding_window_model_equals_transformers(tmp_path, smollm2_dir):
    hf = tiny_hf("mistral", sliding_window=16)
    model_dir = save_hf(hf, tmp_path / "mistral", smollm2_dir)
    prompts = random_prompts([30, 9], 256, seed=6)
    outs = make_llm(model_dir, max_num_batched_tokens=20).generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == [hf_greedy(hf, p, GREEDY.max_tokens) for p in prompts]


def test_logprobs_equal_transformers_across_chunked_prefill(tiny_dir, hf_tiny, prompts):
    llm = make_llm(tiny_dir, max_num_batched_tokens=32)  # the 70-token prompt is prefilled in 3 chunks
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=3, prompt_logprobs=1)
    for seq in run_requests(llm, prompts, params):
        assert seq.prompt_logprobs[0] is None
        assert_logprobs_equal(hf_tiny, seq)
        assert all(e.top[0][0] == e.token_id and len(e.top) == 3 for e in seq.logprobs)  # greedy: the top token
        assert all(len(e.top) == 1 for e in seq.prompt_logprobs[1:])
    assert llm.blocks.num_prefix_hits == 0


def test_logprobs_of_requested_token_ids_equal_transformers(tiny_dir, hf_tiny, prompts):
    import torch

    llm = make_llm(tiny_dir)
    asked = (5, 17, 5, 200)  # a repeated id is reported twice
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True, logprobs=0, logprob_token_ids=asked)
    seq = llm.make_sequence(prompts[0], params)
    llm.enqueue(seq)
    while llm.has_unfinished():
        llm.step()
    with torch.no_grad():
        ref = hf_tiny(torch.tensor([seq.token_ids])).logits[0].log_softmax(-1)  # [T, V]
    assert len(seq.logprobs) == 3
    for i, e in enumerate(seq.logprobs):
        row = ref[len(prompts[0]) - 1 + i]
        assert e.requested == pytest.approx([row[t].item() for t in asked], abs=1e-4)
    with pytest.raises(UserError, match="logprob_token_ids needs logprobs"):
        SamplingParams(logprob_token_ids=(1,))
    with pytest.raises(UserError, match="logprob_token_ids must be in"):
        llm.make_sequence(prompts[0], SamplingParams(logprobs=0, logprob_token_ids=(llm.vocab_size,)))
