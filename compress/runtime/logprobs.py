"""Log-probabilities of chosen tokens and their top alternatives, from raw (untempered) logits."""

from dataclasses import dataclass, field

import torch

MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first
    requested: list[float] = field(default_factory=list)  # logprobs of SamplingParams.logprob_token_ids, in order


def token_logprobs(logits: torch.Tensor, targets: list[int], k: int, requested: tuple[int, ...] = ()) -> list[TokenLogprob]:
    """For each row of logits [N, V], the log-probability of targets[i], the k most likely tokens and
    the log-probabilities of the `requested` token ids."""
    logp = logits.float().log_softmax(-1)  # [N, V]
    chosen = logp.gather(-1, torch.tensor(targets, device=logp.device)[:, None])[:, 0].tolist()  # [N]
    if k:
        top_lp, top_ids = logp.topk(k, dim=-1)  # [N, k]
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
    else:
        tops = [[] for _ in targets]
    asked = logp[:, list(requested)].tolist() if requested else [[] for _ in targets]  # [N, len(requested)]
    return [TokenLogprob(t, lp, top, req) for t, lp, top, req in zip(targets, chosen, tops, asked)]
