"""Speculative sampling's accept/correct rule on explicit distributions, and its counters."""

import torch

from compress.runtime.speculative import SpecStats, accept, accept_greedy


def chi2_pvalue(observed: torch.Tensor, expected: torch.Tensor) -> float:
    """Pearson's test; cells expecting fewer than 5 counts are pooled into one."""
    small = expected < 5
    obs = torch.cat([observed[~small], observed[small].sum()[None]]) if small.any() else observed
    exp = torch.cat([expected[~small], expected[small].sum()[None]]) if small.any() else expected
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    df = torch.tensor(float(keep.sum() - 1))
    return float(torch.special.gammaincc(df / 2, stat / 2))


def draws(p, q, n: int) -> torch.Tensor:
    """First emitted token of n speculative steps, each draft drawn from q with its own seeded generator."""
    first = []
    for seed in range(n):
        g = torch.Generator().manual_seed(seed)
        drafts = [int(torch.multinomial(q[j], 1, generator=g)) for j in range(len(q))]
        first.append(accept(p, q, drafts, g)[0])
    return torch.bincount(torch.tensor(first), minlength=p.shape[-1]).float()


def test_first_token_follows_the_target_whatever_the_draft():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(3, 6, generator=g) * 2, -1)  # [k+1, V]
    uniform = torch.full((2, 6), 1 / 6)
    for q in (uniform, torch.softmax(torch.randn(2, 6, generator=g) * 2, -1), p[:2]):
        counts = draws(p, q, 20_000)
        assert chi2_pvalue(counts, p[0] * 20_000) > 1e-3
        if q is uniform:  # the test has power: these counts do not look like the draft's distribution
            assert chi2_pvalue(counts, uniform[0] * 20_000) < 1e-6


def test_identical_draft_is_always_accepted_and_gains_a_bonus_token():
    p = torch.softmax(torch.randn(4, 10), -1)
    g = torch.Generator().manual_seed(1)
    drafts = [3, 1, 7]
    assert accept(p, p[:3], drafts, g)[:3] == drafts
    assert len(accept(p, p[:3], drafts, g)) == 4


def test_greedy_one_hot_accepts_up_to_the_first_mismatch_then_takes_the_target_argmax():
    p = torch.eye(5)[[2, 4, 0, 1]]  # target argmax per position: 2, 4, 0, then 1 after all drafts
    q = torch.eye(5)[[2, 4, 3]]
    assert accept(p, q, [2, 4, 3], torch.Generator().manual_seed(0)) == [2, 4, 0]
    assert accept(p, p[:3], [2, 4, 0], torch.Generator().manual_seed(0)) == [2, 4, 0, 1]
    assert accept(p, torch.eye(5)[[1]], [1], torch.Generator().manual_seed(0)) == [2]


def test_stats_per_position_and_tokens_per_step():
    stats = SpecStats(3)
    stats.record(3, 3)  # all accepted: 4 tokens
    stats.record(3, 1)  # first accepted, second rejected: 2 tokens
    stats.record(2, 0)  # a shortened proposal, rejected at once: 1 token
    stats.record(0, 0)  # no drafts: not a speculative step
    assert stats.proposed == [3, 3, 2] and stats.accepted == [2, 1, 1]
    assert stats.acceptance() == [2 / 3, 1 / 3, 1 / 2]
    assert stats.steps == 3 and stats.tokens_per_step == 7 / 3
    assert stats.acceptance_rate == 4 / 8


def test_greedy_shortcut_agrees_with_one_hot_acceptance():
    g = torch.Generator().manual_seed(3)
    for _ in range(50):
        argmax = torch.randint(0, 4, (4,), generator=g).tolist()
        drafts = torch.randint(0, 4, (3,), generator=g).tolist()
        one_hot = torch.eye(4)
        assert accept_greedy(argmax, drafts) == accept(one_hot[argmax], one_hot[drafts], drafts, g)
