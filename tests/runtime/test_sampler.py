import torch

from compress.runtime.sampler import Sampler, filter_top_k_top_p
from compress.runtime.sequence import SamplingParams, Sequence


def seqs(*params):
    return [Sequence(i, [1], p, frozenset()) for i, p in enumerate(params)]


def test_top_k_and_top_p_keep_the_right_tokens():
    probs = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3)
    logits = probs.log()[:, [3, 0, 4, 1, 2]]  # shuffled, so that the filter must sort
    out = filter_top_k_top_p(logits, torch.tensor([2, 0, 0]), torch.tensor([1.0, 0.7, 0.75]))
    kept = [set(torch.isfinite(row).nonzero().flatten().tolist()) for row in out]
    assert kept[0] == {1, 3}  # top-2: 0.5, 0.2
    assert kept[1] == {1, 3}  # 0.5 + 0.2 reaches 0.7
    assert kept[2] == {1, 3, 4}  # 0.75 needs 0.15 too
    assert torch.equal(out[0, [1, 3]], logits[0, [1, 3]])


def test_top_p_always_keeps_the_most_likely_token():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    out = filter_top_k_top_p(logits, torch.tensor([0]), torch.tensor([0.01]))
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [1]


def test_greedy_rows_take_the_argmax_and_sampled_rows_follow_the_filter():
    logits = torch.randn(2, 50)
    greedy, top1 = SamplingParams(temperature=0), SamplingParams(temperature=5.0, top_k=1, seed=0)
    assert Sampler()(logits, seqs(greedy, top1)) == logits.argmax(-1).tolist()


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    s = seqs(SamplingParams(seed=1))
    counts = torch.bincount(torch.tensor([Sampler()(probs.log()[None], s)[0] for _ in range(3000)]), minlength=4)
    assert counts[3] == 0
    assert torch.allclose(counts.float() / 3000, probs, atol=0.04)


def test_seeded_rows_do_not_depend_on_the_batch():
    logits = torch.randn(4, 100)
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=7)
    alone = Sampler()(logits[2:3], seqs(p))[0]
    batch = seqs(SamplingParams(temperature=1.0), SamplingParams(temperature=0), p, SamplingParams(top_k=3))
    assert Sampler()(logits, batch)[2] == alone
    again = seqs(p)[0]
    draws = [Sampler()(logits[2:3], [again])[0] for _ in range(20)]
    assert len(set(draws)) > 1  # the generator advances: successive draws differ
