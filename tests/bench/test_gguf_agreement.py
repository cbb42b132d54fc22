"""The agreement report's lines: where llama.cpp's argmax leaves our greedy path, and the logprob differences."""

import torch

from compress.bench.gguf_agreement import lines
from compress.runtime.logprobs import token_logprobs


def test_lines_name_the_first_parting_and_the_largest_difference():
    ours = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 2.0, 1.9, -1.0]])  # our logits: greedy picks 0, then 1
    theirs = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.0, 1.9, 2.0, -1.0]]).log_softmax(-1)  # llama.cpp picks 2 at 1
    out = [0, 1]
    report = lines("p", out, token_logprobs(ours, out, 3), theirs)
    assert report[0].startswith("'p': equal for 1/2 tokens")
    assert "<- llama.cpp: 2" in report[2] and "<-" not in report[1]
    worst = float(report[0].rsplit(" ", 1)[1])
    assert abs(worst - 0.1) < 1e-3  # token 1's and 2's logprobs swapped by 0.1 between the engines


class FakeLlama:
    """llama-cpp-python's Llama as gguf_agreement uses it: the next token's logits favour (last + 1) % V, and an
    evaluation of several tokens at once (``skew``) nudges token 0 up by that much."""

    def __init__(self, vocab: int = 8, skew: float = 0.0):
        self.vocab, self.skew = vocab, skew
        self.reset()

    def reset(self):
        self.scores, self.n_tokens = [], 0

    def eval(self, tokens: list[int]):
        for t in tokens:
            row = [0.0] * self.vocab
            row[(t + 1) % self.vocab] = 1.0
            row[0] += self.skew if len(tokens) > 1 else 0.0
            self.scores.append(row)
        self.n_tokens += len(tokens)


def test_itself_reports_where_batched_and_token_by_token_part():
    from compress.bench.gguf_agreement import itself

    same = itself("p", FakeLlama(), [1, 2], 4)
    assert "equal for 4/4 tokens" in same and same.endswith(": 0.0000")
    parted = itself("p", FakeLlama(skew=2.0), [1, 2], 4)  # batched: token 0 wins at the prompt's end
    assert "equal for 0/4 tokens" in parted and not parted.endswith(": 0.0000")
