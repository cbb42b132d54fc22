"""Sampler: greedy / temperature / top-k / top-p over a step's logits, one torch.Generator per request.

Filters run batched over the rows; the random draw is the exponential-race form of sampling
(argmax of p / E with E ~ Exp(1) i.i.d.), with each request's E drawn from its own generator, so
a seeded request samples the same tokens whatever else shares its batch.
"""

import torch

from compress.runtime.sequence import Sequence


def filter_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """logits [S, V] with everything outside each row's top-k, then outside its top-p nucleus, set to -inf.

    top_k [S] long (0 = off), top_p [S] float (1 = off). The nucleus is the smallest set of most
    likely tokens whose probability reaches top_p (after top-k, renormalized); it always keeps one.
    """
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(-1, descending=True)  # [S, V]
    k = torch.where(top_k > 0, top_k, vocab)
    sorted_logits.masked_fill_(torch.arange(vocab, device=logits.device)[None] >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(-1)
    mass_before = probs.cumsum(-1) - probs  # [S, V]
    sorted_logits.masked_fill_(mass_before >= top_p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)


def race(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token drawn from probs [V] (need not sum to 1): argmax of p / E, E ~ Exp(1) from the request's generator."""
    noise = torch.empty(probs.shape[-1]).exponential_(generator=generator)
    return int((probs / noise.to(probs.device)).argmax())


def warp(logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
    """The distributions [S, V] that row i of logits [S, V] is sampled from under seqs[i]'s params
    (temperature, top-k, top-p); one-hot at the argmax for a greedy request."""
    params = [s.params for s in seqs]
    temperature = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
    logits = logits / temperature[:, None]
    if any(p.top_k or p.top_p < 1 for p in params):
        top_k = torch.tensor([p.top_k for p in params], device=logits.device)
        top_p = torch.tensor([p.top_p for p in params], device=logits.device)
        logits = filter_top_k_top_p(logits, top_k, top_p)
    probs = logits.softmax(-1)
    greedy = torch.tensor([p.greedy for p in params], device=logits.device)
    if greedy.any():
        one_hot = torch.zeros_like(probs).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy[:, None], one_hot, probs)
    return probs


class Sampler:
    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row of logits [S, V] (fp32), row i for seqs[i]."""
        tokens = logits.argmax(-1)  # [S]
        rows = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if rows:
            probs = warp(logits[rows], [seqs[i] for i in rows])  # [S', V]
            tokens[rows] = torch.tensor([race(p, seqs[i].generator) for p, i in zip(probs, rows)], device=tokens.device)
        return tokens.tolist()
