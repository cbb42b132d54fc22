"""Log-probabilities of chosen tokens and their top alternatives, from raw (untempered) logits."""

from dataclasses import dataclass

import torch

MAX_LOGPROBS = 20


@dataclass
class TokenLogprob:
    token_id: int
    logprob: float
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


def token_logprobs(logits: torch.Tensor, targets: list[int], k: int) -> list[TokenLogprob]:
    """For each row of logits [N, V], the log-probability of targets[i] and the k most likely tokens."""
    logp = logits.float().log_softmax(-1)  # [N, V]
    chosen = logp.gather(-1, torch.tensor(targets, device=logp.device)[:, None])[:, 0].tolist()  # [N]
    if k:
        top_lp, top_ids = logp.topk(k, dim=-1)  # [N, k]
        tops = [list(zip(i, v)) for i, v in zip(top_ids.tolist(), top_lp.tolist())]
    else:
        tops = [[] for _ in targets]
    return [TokenLogprob(t, lp, top) for t, lp, top in zip(targets, chosen, tops)]
