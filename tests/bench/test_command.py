"""`compress bench`: the batch sweep with its roofline, --compare ratios, the plot; bad input is one line, exit 2."""

import pytest

from tests.conftest import run_main

SMALL = ("--batch-sizes", "1,2", "--prompt-len", "8", "--new-tokens", "4")


def run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    return run_main(monkeypatch, capsys, "bench", *args)


def test_compare_prints_both_sweeps_and_their_ratios_and_writes_the_plot(tiny_dir, tiny_int4_dir, tmp_path, monkeypatch, capsys):
    plot = tmp_path / "roofline.png"
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), "--compare", str(tiny_int4_dir), "--plot", str(plot), *SMALL)
    assert code == 0, err
    assert "copy test:" in out and "GB/s" in out
    heads = [line for line in out.splitlines() if line.startswith(("| model | batch |", "| batch |"))]
    assert len(heads) == 2  # the sweep table, the ratio table
    for name in ("model", "rtn-int4"):
        assert f"| {name} | 1 |" in out and f"| {name} | 2 |" in out
    assert f"ratios: {tiny_int4_dir.name} / {tiny_dir.name}" in out
    assert "model: linear 64x64 fp32 (2): " in out and "rtn-int4: linear 64x64 4-bit g64 (2): " in out  # the kernels chosen (o_proj)
    ratio_rows = out.split("ratios:")[1].splitlines()[3:5]
    assert [r.split(" | ")[0] for r in ratio_rows] == ["| 1", "| 2"]
    read, stored = ([float(r.split(" | ")[i].rstrip("x")) for r in ratio_rows] for i in (6, 7))
    assert all(s <= r < 1 for r, s in zip(read, stored))  # the CPU path holds 4-bit nibbles: below dense, not below the checkpoint
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mixed_workload_with_compare_runs_both_engines(tiny_dir, tiny_int4_dir, monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), "--workload", "mixed", "--no-hf", "--compare", str(tiny_int4_dir),
                         "--requests", "2", "--max-prompt", "16", "--max-new", "16")
    assert code == 0, err
    assert "| compress runtime |" in out and f"| compress runtime: {tiny_int4_dir.name} |" in out


def test_mixed_workload_runs_the_transformers_baselines(tiny_dir, monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), "--workload", "mixed", "--requests", "2", "--max-prompt", "16",
                         "--max-new", "16")
    assert code == 0, err
    for row in ("| compress runtime |", "| transformers generate, static batches of 16 |", "| transformers continuous batching |"):
        assert row in out
    assert "bs=1 decode: compress " in out


@pytest.mark.parametrize("args,fragment", [
    (("--batch-sizes", "1,0"), "--batch-sizes"), (("--batch-sizes", "-8"), "--batch-sizes"),
    (("--batch-sizes", "1,x"), "--batch-sizes"), (("--gpu", "v100"), "--gpu"), (("--new-tokens", "1"), "--new-tokens"),
    (("--plot", "/nonexistent/dir/plot.png"), "--plot"), (("--workload", "mixed", "--plot", "p.png"), "--plot"), (("--batch-sizes", "1024"), "--max-num-batched-tokens"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_dir, monkeypatch, capsys, args, fragment):
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err
    assert out == ""
