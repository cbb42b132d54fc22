"""NgramDrafter: speculative decoding without a draft model (prompt lookup; vLLM's ``ngram`` method).

A sequence's draft is what followed the latest earlier occurrence of its last n tokens (the
longest n from max_n down to min_n that occurs) in its own prompt and output. It costs no forward
pass, so it pays off wherever text repeats its context: summaries and extraction quoting the
prompt, code edits, and the loops small models fall into. As a draft distribution it is one-hot,
so the acceptance rule stays exact: a drafted token x is kept with probability p(x), and a
rejection draws from p with x taken out.
"""

import torch
import torch.nn.functional as F

from compress.runtime.drafter import draft_budget
from compress.runtime.sequence import Sequence

NGRAM = "ngram"  # the --draft value that selects this drafter


def lookup(tokens: list[int], k: int, max_n: int = 4, min_n: int = 1) -> list[int]:
    """k tokens predicted from the latest earlier occurrence of the last n tokens (longest n first):
    what followed it, repeated with the period the match implies when fewer than k tokens follow
    (in a short loop the latest occurrence overlaps the suffix)."""
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix, last = tokens[-n:], tokens[-1]
        for i in range(len(tokens) - n - 1, -1, -1):  # a match must be followed by at least one token
            if tokens[i + n - 1] == last and tokens[i:i + n] == suffix:
                period = len(tokens) - n - i
                return [tokens[i + n + j % period] for j in range(k)]
    return []


class NgramDrafter:
    def __init__(self, k: int, max_model_len: int, max_n: int = 4, min_n: int = 1):
        self.k, self.max_model_len, self.max_n, self.min_n = k, max_model_len, max_n, min_n
        self.vocab_size = 0

    def propose(self, running: list[Sequence], vocab_size: int) -> None:
        """Append up to k looked-up tokens to every running sequence that is decoding."""
        self.vocab_size = vocab_size
        for seq in running:
            budget = draft_budget(seq, self.k, self.max_model_len)
            if seq.num_computed != seq.num_tokens - 1 or budget <= 0:
                continue
            tokens = lookup(seq.token_ids, budget, self.max_n, self.min_n)
            seq.token_ids.extend(tokens)
            seq.num_draft += len(tokens)

    def draft_probs(self, seq: Sequence) -> torch.Tensor:
        """[num_draft, V]: one-hot at each drafted token."""
        drafts = torch.tensor(seq.token_ids[seq.num_tokens - seq.num_draft:], dtype=torch.long)
        return F.one_hot(drafts, self.vocab_size).float()

    def sync(self) -> None:
        """Nothing to roll back: the drafter keeps no state between steps."""
