"""Speculative decoding in the engine: greedy output identical to the target alone, sampled output
distributed exactly as the target's, and both KV pools free after a workload full of rejections."""

import pytest
import torch

from compress.errors import UserError
from compress.runtime import LLM, SamplingParams
from compress.runtime.drafter import Drafter
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import GREEDY, make_llm
from tests.runtime.test_speculative import chi2_pvalue



@pytest.fixture(scope="module")
def other_draft(tmp_path_factory, smollm2_dir):
    """A different random model with the same tokenizer: a poor draft, so many tokens are rejected."""
    return save_hf(tiny_hf("llama", vocab=49152, tie_word_embeddings=True, seed=1), tmp_path_factory.mktemp("draft") / "m", smollm2_dir)


def assert_pools_free(llm: LLM) -> None:
    assert llm.blocks.num_free == llm.blocks.num_blocks
    if isinstance(llm.drafter, Drafter):  # the ngram drafter has no pool
        assert llm.drafter.blocks.num_free == llm.drafter.blocks.num_blocks
        assert not llm.drafter.shadows


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_is_identical_to_the_target_alone(tiny_dir, other_draft, prompts, expected, k):
    for draft in (tiny_dir, other_draft):
        llm = make_llm(tiny_dir, draft=draft, num_speculative_tokens=k)
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
        assert_pools_free(llm)
    assert llm.spec_stats.steps > 0 and 0 < llm.spec_stats.acceptance_rate < 1  # the poor draft: some of each


def test_the_target_as_its_own_draft_accepts_everything(tiny_dir, prompts, expected):
    llm = make_llm(tiny_dir, draft=tiny_dir, num_speculative_tokens=4)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert llm.spec_stats.acceptance() == [1.0] * 4
    # 23 tokens after the prefill's first: 4 steps of 5 and one of 3 (the budget stops at max_tokens).
    assert llm.spec_stats.steps == 5 * len(prompts)


def test_a_restricted_draft_vocabulary_proposes_only_low_ids(tiny_dir, prompts, expected):
    # The target as its own draft: every draft token is right, unless the draft may not score it.
    below = 1 + max(t for out in expected for t in out)
    for vocab, rate in ((below, 1.0), (min(t for out in expected for t in out), 0.0)):
        llm = make_llm(tiny_dir, draft=tiny_dir, num_speculative_tokens=3, draft_vocab=vocab)
        assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
        assert llm.spec_stats.acceptance_rate == rate
        assert_pools_free(llm)


def test_small_pool_and_budget_drop_drafts_preempt_and_still_match(tiny_dir, other_draft, prompts, expected):
    llm = make_llm(tiny_dir, blocks=8, draft=other_draft, num_speculative_tokens=3, max_num_batched_tokens=32)
    assert [o.token_ids for o in llm.generate(prompts, GREEDY)] == expected
    assert llm.scheduler.num_preemptions > 0
    assert_pools_free(llm)


def test_abort_mid_speculation_frees_both_pools(tiny_dir, other_draft, prompts):
    llm = make_llm(tiny_dir, draft=other_draft, num_speculative_tokens=3)
    ids = [llm.add_request(p, GREEDY) for p in prompts]
    for _ in range(3):
        llm.step()
    assert llm.drafter.shadows
    for i in ids:
        llm.abort(i)
    assert_pools_free(llm)


def test_stop_token_inside_accepted_drafts_ends_the_output_there(tiny_dir, prompts, expected):
    stop = expected[0][6]
    params = SamplingParams(max_tokens=24, temperature=0, stop_token_ids=(stop,))
    llm = make_llm(tiny_dir, draft=tiny_dir, num_speculative_tokens=5)
    out = llm.generate([prompts[0]], params)[0]
    assert out.token_ids == expected[0][:expected[0].index(stop) + 1] and out.finish_reason == "stop"


def test_logprobs_of_speculated_tokens_equal_those_without_a_draft(tiny_dir, other_draft, prompts):
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=2)
    seqs = []
    for llm in (make_llm(tiny_dir), make_llm(tiny_dir, draft=other_draft, num_speculative_tokens=3)):
        seq = llm.make_sequence(prompts[1], params)
        llm.enqueue(seq)
        while llm.has_unfinished():
            llm.step()
        seqs.append(seq)
    plain, spec = seqs
    assert spec.output_token_ids == plain.output_token_ids and len(spec.logprobs) == 12
    for x, y in zip(plain.logprobs, spec.logprobs):
        assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-4)
        assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_a_draft_with_another_tokenizer_is_refused(tiny_dir, tmp_path):
    from transformers import AutoTokenizer

    other = save_hf(tiny_hf("llama", vocab=49152), tmp_path / "m")
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    tok.add_tokens(["<not-in-the-target>"])
    tok.save_pretrained(other)
    with pytest.raises(UserError, match="different tokenizer"):
        make_llm(tiny_dir, draft=other)


# Sampling: the first three generated tokens (the first from the target's prefill, the next two from one
# speculative step with k=2) over 20,000 seeded requests against the target's exact joint distribution.
VOCAB, RUNS, PROMPT = 8, 20_000, [1, 2, 3]


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory, smollm2_dir):
    target = tiny_hf("llama", vocab=VOCAB)
    with torch.no_grad():
        target.lm_head.weight.mul_(6)  # peaked, so the distributions differ from uniform and from each other
    root = tmp_path_factory.mktemp("small-vocab")
    good = tiny_hf("llama", vocab=VOCAB)
    good.load_state_dict(target.state_dict())
    bad = tiny_hf("llama", vocab=VOCAB, seed=2)
    with torch.no_grad():
        good.lm_head.weight.add_(torch.randn_like(good.lm_head.weight))
        bad.lm_head.weight.zero_()  # uniform over the vocabulary
    dirs = {name: save_hf(m, root / name, smollm2_dir) for name, m in [("target", target), ("good", good), ("bad", bad)]}
    return dirs, exact_joint(target)


@torch.no_grad()
def exact_joint(model) -> torch.Tensor:
    """P(t1, t2, t3 | PROMPT) [V, V, V] from transformers' logits, temperature 1."""
    def probs(prefixes: torch.Tensor) -> torch.Tensor:
        ids = torch.cat([torch.tensor(PROMPT).expand(len(prefixes), -1), prefixes], 1)
        return model(ids).logits[:, -1].float().softmax(-1)  # [N, V]

    grid = torch.cartesian_prod(torch.arange(VOCAB), torch.arange(VOCAB))  # [V*V, 2]
    p1 = probs(torch.empty(1, 0, dtype=torch.long))[0]  # [V]
    p2 = probs(torch.arange(VOCAB)[:, None])  # [V, V]
    p3 = probs(grid).view(VOCAB, VOCAB, VOCAB)
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.mark.slow
@pytest.mark.parametrize("draft, draft_vocab", [("good", None), ("bad", None), ("good", 5), ("ngram", None)])
def test_sampled_tokens_follow_the_targets_exact_distribution(small_vocab, draft, draft_vocab):
    dirs, joint = small_vocab
    llm = LLM(dirs["target"], draft=dirs.get(draft, draft), num_speculative_tokens=2, draft_vocab=draft_vocab,
              max_num_seqs=2048, max_num_batched_tokens=8192, kv_cache_memory=64 << 20)
    if draft_vocab:
        assert llm.drafter.runner.model.lm_head.out_features == draft_vocab
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=i, ignore_eos=True) for i in range(RUNS)]
    outs = llm.generate([PROMPT] * RUNS, params)
    first3 = torch.tensor([o.token_ids[:3] for o in outs])  # [RUNS, 3]
    counts = torch.bincount((first3 * torch.tensor([VOCAB * VOCAB, VOCAB, 1])).sum(1), minlength=VOCAB ** 3).float()
    if draft == "ngram":  # a lookup finds a draft when the first token is one of the prompt's
        assert 0 < llm.spec_stats.proposed[1] < RUNS
    else:  # every request speculated two tokens
        assert llm.spec_stats.proposed[1] == RUNS
    assert chi2_pvalue(counts, joint.flatten() * RUNS) > 1e-3
    drafted = joint.sum((1, 2))[:, None, None] * torch.full((VOCAB, VOCAB), 1 / VOCAB ** 2)  # t2, t3 from a uniform draft
    if draft == "bad":  # the test has power: the draft's own distribution is rejected
        assert chi2_pvalue(counts, drafted.flatten() * RUNS) < 1e-6
    assert_pools_free(llm)
