"""Every family through the engine (CPU, fp32): greedy tokens equal transformers' generate with the paged cache,
prefix sharing, chunked prefill and a batch of several sequences in play.

Prompts are longer than the families' sliding window (6) and, for Qwen 3 (yarn) and Phi-3 (longrope), longer than the
original context (16). Phi-3's longrope picks short or long factors by sequence length: every chunk of a prompt takes
the whole prompt's (as transformers' one forward over it), and decode steps their sequence's length. transformers'
generate recomputes the whole cache when a sequence crosses original_max_position_embeddings during decoding; our
engine (like vLLM) keeps the keys cached with the factors of their step, so the two agree only for prompts already
past the original context: the prompts here are. The 12-token budget puts the first chunk within the original context.
The server test sends one request per new family: the prompt's logprobs (echo) and the greedy text."""

import openai
import pytest
import torch

from compress.runtime import SamplingParams
from compress.runtime.local_server import running_server
from tests.conftest import save_hf, tiny_hf
from tests.families import FAMILIES, NEW
from tests.runtime.conftest import assert_logprobs_equal, hf_greedy, make_llm, random_prompts, run_requests

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)


@pytest.mark.parametrize("kind", FAMILIES)
def test_family_greedy_equals_transformers(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, features=True)
    model_dir = save_hf(hf, tmp_path / kind, smollm2_dir)
    prefix, a, b, c = random_prompts([20, 5, 9, 30], 256, seed=11)
    prompts = [prefix + a, prefix + b, c]  # two share 20 prefix tokens (one full block of 16)
    llm = make_llm(model_dir, max_num_batched_tokens=12)  # every prompt is prefilled in chunks
    first = llm.add_request(prompts[0], PARAMS)
    llm.step(), llm.step()  # the first prompt's chunks register the shared block before the others arrive
    rest = [llm.add_request(p, PARAMS) for p in prompts[1:]]
    done = {}
    while llm.has_unfinished():
        done.update((o.request_id, o.token_ids) for o in llm.step() if o.finished)
    assert [done[i] for i in [first, *rest]] == [hf_greedy(hf, p, PARAMS.max_tokens) for p in prompts]
    assert llm.blocks.num_prefix_hits >= 1
    assert llm.blocks.num_free == llm.blocks.num_blocks


@pytest.mark.parametrize("kind", FAMILIES)
def test_family_logprobs_equal_transformers_across_chunked_prefill(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, features=True)
    llm = make_llm(save_hf(hf, tmp_path / kind, smollm2_dir), max_num_batched_tokens=12)
    params = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    for seq in run_requests(llm, random_prompts([25, 30], 256, seed=13), params):
        assert_logprobs_equal(hf, seq)


@pytest.mark.parametrize("kind", NEW)
def test_family_over_the_server_scores_the_prompt_as_transformers_does(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, features=True)
    llm = make_llm(save_hf(hf, tmp_path / kind, smollm2_dir))
    ids = random_prompts([24], 256, seed=12)[0]
    with running_server(llm) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        res = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, echo=True, logprobs=1,
                                            extra_body={"ignore_eos": True})
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].log_softmax(-1)  # [T, V]
    lp = res.choices[0].logprobs.token_logprobs
    assert lp[1:len(ids)] == pytest.approx([ref[p - 1, ids[p]].item() for p in range(1, len(ids))], abs=1e-4)
    out = llm.tokenizer.decode(hf_greedy(hf, ids, 6), skip_special_tokens=True)
    assert res.choices[0].text == llm.tokenizer.decode(ids) + out
