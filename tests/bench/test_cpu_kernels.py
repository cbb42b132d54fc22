"""The CPU kernel benchmark runs end to end on small shapes: the host line, attention, the choice table and the check."""

import pytest

from compress.bench import cpu_kernels
from compress.kernels import linear_cpu, nibble_linear_cpu, paged_attention_cpu

pytestmark = pytest.mark.skipif(None in (paged_attention_cpu.load(), linear_cpu.load(), nibble_linear_cpu.load()), reason="no C compiler")


def test_both_attention_paths_are_timed_on_the_same_step():
    torch_ms, c_ms, tokens = cpu_kernels.attention_step(repeats=1, seqs=3, layers=2)
    assert torch_ms > 0 and c_ms > 0
    assert 3 * 16 <= tokens <= 3 * 768


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "attention_step", lambda repeats: (2.0, 1.0, 123))
    monkeypatch.setitem(cpu_kernels.SHAPES, "smollm2", [(64, 128, 3), (40, 64, 1)])


def test_tables_have_a_row_per_shape_and_kind_and_a_cell_per_bucket(capsys, small):
    cpu_kernels.main(["--repeats", "1", "--max-rows", "8", "--step-rows", "1,8"])
    out = capsys.readouterr().out
    assert out.startswith("host: ") and "threads; torch " in out.splitlines()[0]
    assert "torch / C 2.00x" in out and "decode attention per bucket" in out
    choice = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 64x128") or line.startswith("| 40x64")]
    labels = [row[0].strip() for row in choice]
    assert labels[:4] == ["64x128 fp32 (3)", "64x128 int4 g64 (3)", "40x64 fp32 (1)", "40x64 int4 g64 (1)"]
    assert all(len(row) == 1 + len([1, 2, 3, 4, 6, 8]) and all(c.split()[1] in ("C", "t", "p") for c in row[1:]) for row in choice[:4])
    checks = choice[4:]
    assert len(checks) == 4 and all(" at " in row[1] or row[1].strip() == "noisy" for row in checks)  # worst ratio and where
    step = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| 1 |", "| 8 |"))]
    assert "a whole step's 3 Linears + lm_head" in out and [row[0].strip() for row in step] == ["1", "8"]


def test_rows_picks_the_row_counts_and_skips_the_check(capsys, small):
    cpu_kernels.main(["--repeats", "1", "--rows", "1,5"])
    out = capsys.readouterr().out
    assert "| Linear (in the model) | 1 | 5 |" in out and "check" not in out


def test_check_rows_are_the_buckets_and_halfway_between():
    assert cpu_kernels.check_rows(16) == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]


@pytest.mark.parametrize("argv", [["--rows", "1,x"], ["--rows", "0,5"], ["--repeats", "0"], ["--step-rows", "0"]])
def test_bad_arguments_are_one_line(argv):
    with pytest.raises(SystemExit, match="--rows|--repeats"):
        cpu_kernels.main(argv)
