"""NgramDrafter: speculative decoding without a draft model (prompt lookup; vLLM's ``ngram`` method).

A sequence's draft is what followed the latest earlier occurrence of its last n tokens (the
longest n from MAX_N down to 1 that occurs) in its own prompt and output. It costs no forward
pass, so it pays off wherever text repeats its context: summaries and extraction quoting the
prompt, code edits, and the loops small models fall into. As a draft distribution it is one-hot,
so the acceptance rule stays exact: a drafted token x is kept with probability p(x), and a
rejection draws from p with x taken out.
"""

import torch
import torch.nn.functional as F

from compress.runtime.sequence import Sequence
from compress.runtime.speculative import draft_budget

NGRAM = "ngram"  # the --draft value that selects this drafter
MAX_N = 4
WINDOW = 2048  # the latest tokens searched: a pure-Python scan per sequence and step


def lookup(tokens: list[int], k: int, max_n: int = MAX_N) -> list[int]:
    """k tokens predicted from the latest earlier occurrence of the last n tokens (longest n first):
    what followed it, repeated with the period the match implies when fewer than k tokens follow
    (in a short loop the latest occurrence overlaps the suffix)."""
    tokens = tokens[-WINDOW:]
    for n in range(min(max_n, len(tokens) - 1), 0, -1):
        suffix, last = tokens[-n:], tokens[-1]
        for i in range(len(tokens) - n - 1, -1, -1):  # a match must be followed by at least one token
            if tokens[i + n - 1] == last and tokens[i:i + n] == suffix:
                period = len(tokens) - n - i
                return [tokens[i + n + j % period] for j in range(k)]
    return []


class NgramDrafter:
    def __init__(self, k: int, max_model_len: int, vocab_size: int, device: str):
        self.k, self.max_model_len, self.vocab_size, self.device = k, max_model_len, vocab_size, device

    def propose(self, running: list[Sequence]) -> None:
        """Append up to k looked-up tokens to every running sequence that is decoding."""
        for seq in running:
            budget = draft_budget(seq, self.k, self.max_model_len)
            if budget > 0:
                tokens = lookup(seq.token_ids, budget)
                seq.token_ids.extend(tokens)
                seq.num_draft += len(tokens)

    def draft_probs(self, seq: Sequence) -> torch.Tensor:
        """[num_draft, V] on the engine's device: one-hot at each drafted token."""
        drafts = torch.tensor(seq.token_ids[seq.num_tokens - seq.num_draft:], dtype=torch.long, device=self.device)
        return F.one_hot(drafts, self.vocab_size).float()

    def sync(self) -> None:
        """Nothing to roll back: proposals are computed afresh from the tokens each step."""
