"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): accept or correct a draft's tokens so
that the output is distributed exactly as the target's.

Draft token x_j, drawn from the draft's distribution q_j, is accepted with probability
min(1, p_j(x_j) / q_j(x_j)). At the first rejection a token is drawn from norm(max(p_j - q_j, 0))
and the rest are discarded; if all k are accepted one more is drawn from p_k. p and q are the
*warped* distributions (temperature, top-k, top-p applied; one-hot for greedy), so greedy
speculation reproduces greedy decoding and sampled speculation samples the warped target.
"""

from dataclasses import dataclass, field

import torch

from compress.runtime.sampler import race
from compress.runtime.sequence import Sequence


def draft_budget(seq: Sequence, k: int, max_model_len: int) -> int:
    """Draft tokens worth proposing for seq: none while its prompt is still being computed, and never
    past max_tokens (the extra would be thrown away) or the context (one token is left for the target)."""
    if seq.num_computed != seq.num_tokens - 1:
        return 0
    left = min(seq.params.max_tokens - seq.num_output_tokens, max_model_len - seq.num_tokens)
    return min(k, left - 1)


def accept_greedy(target_argmax: list[int], drafts: list[int]) -> list[int]:
    """The greedy case (p one-hot): drafts are accepted while they equal the target's argmax.
    target_argmax has one entry per draft position and one past them."""
    for j, x in enumerate(drafts):
        if x != target_argmax[j]:
            return drafts[:j] + [target_argmax[j]]
    return drafts + [target_argmax[len(drafts)]]


def accept(p: torch.Tensor, q: torch.Tensor, drafts: list[int], generator: torch.Generator) -> list[int]:
    """p [k+1, V] target, q [k, V] draft distributions at the k draft positions (and one past them);
    returns the accepted drafts followed by one token drawn by the target."""
    for j, x in enumerate(drafts):
        r = torch.rand((), generator=generator).item()
        if r * q[j, x] < p[j, x]:  # r < p / q without dividing by a tiny q
            continue
        residual = (p[j] - q[j]).clamp_min(0)
        # p(x) < q(x) here, so the residual has mass unless rounding ate it all.
        return drafts[:j] + [race(residual if residual.sum() > 0 else p[j], generator)]
    return drafts + [race(p[len(drafts)], generator)]


@dataclass
class SpecStats:
    """Acceptance counters: proposed[j] / accepted[j] count draft tokens at position j of a proposal."""

    k: int
    proposed: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    steps: int = 0  # verifications that had at least one draft token
    emitted: int = 0  # tokens those verifications produced (accepted drafts + one from the target)

    def __post_init__(self):
        self.proposed, self.accepted = [0] * self.k, [0] * self.k

    def record(self, num_drafts: int, num_accepted: int) -> None:
        if num_drafts == 0:
            return
        for j in range(num_drafts):
            self.proposed[j] += 1
            self.accepted[j] += j < num_accepted
        self.steps += 1
        self.emitted += num_accepted + 1

    def acceptance(self) -> list[float]:
        """Per position: the fraction of proposed draft tokens that were accepted."""
        return [a / p if p else float("nan") for a, p in zip(self.accepted, self.proposed)]

    @property
    def acceptance_rate(self) -> float:
        return sum(self.accepted) / max(sum(self.proposed), 1)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens a verification step emits (accepted drafts + 1); 1.0 means the draft never helps."""
        return self.emitted / max(self.steps, 1)
