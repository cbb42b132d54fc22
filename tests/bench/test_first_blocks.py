"""first_blocks times the first blocks of a real quantize run and stops there; --tune-iters tunes them too."""

from click.testing import CliRunner

from compress.bench import first_blocks
from compress.quant import awq_apply


def test_tune_iters_tunes_each_timed_block_and_says_so(tiny_dir, monkeypatch):
    tuned, tune = [], awq_apply.tune_block
    monkeypatch.setattr(awq_apply, "tune_block", lambda *a, **k: (tuned.append(a[6]), tune(*a, **k))[1])
    args = [str(tiny_dir), "--blocks", "1", "--calib-samples", "4", "--calib-seq-len", "16"]
    plain = CliRunner().invoke(first_blocks.main, args)
    assert plain.exit_code == 0, plain.output
    assert tuned == [] and "tuning" not in plain.output
    res = CliRunner().invoke(first_blocks.main, args + ["--tune-iters", "3"])
    assert res.exit_code == 0, res.output
    assert tuned == [3]  # the first block only: it stopped after --blocks 1
    assert "16 calibration tokens, 3 tuning steps: block 0:" in res.output and "2 blocks at" in res.output
