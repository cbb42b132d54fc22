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
