"""`python -m compress.bench.decode_step`: the C decode step against the module path on the tiny int4 model."""

import re

import pytest
from click.testing import CliRunner

from compress.bench.decode_step import main
from compress.kernels import decode_step_cpu


@pytest.mark.skipif(decode_step_cpu.load() is None, reason="no C compiler builds the kernels here")
def test_prints_both_times_and_the_same_tokens(tiny_int4_dir):
    result = CliRunner().invoke(main, [str(tiny_int4_dir), "--batch", "2", "--prompt-len", "5", "--new-tokens", "3", "--repeats", "2"])
    assert result.exit_code == 0, result.output
    assert re.search(r"batch 2, 5-token prompts \+ 3 tokens, fastest of 2: module path [\d.]+ s, C step [\d.]+ s, [\d.]+x; "
                     r"same tokens: True; the C step ran [1-9]\d* steps$", result.output, re.MULTILINE), result.output


def test_a_model_without_the_step_is_one_line(tiny_int4_dir, monkeypatch):
    monkeypatch.setattr(decode_step_cpu, "load", lambda: None)  # no compiler: no step
    result = CliRunner().invoke(main, [str(tiny_int4_dir)])
    assert result.exit_code == 2 and "does not run the one-call decode step" in result.output
