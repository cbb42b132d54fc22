"""The CPU kernel benchmark runs end to end on small sizes and times both paths."""

import pytest

from compress.kernels import linear_cpu, nibble_linear_cpu, paged_attention_cpu
from compress.bench import cpu_kernels

pytestmark = pytest.mark.skipif(None in (paged_attention_cpu.load(), linear_cpu.load(), nibble_linear_cpu.load()), reason="no C compiler")


def test_both_paths_are_timed_on_the_same_step():
    torch_ms, c_ms, tokens = cpu_kernels.attention_step(repeats=1, seqs=3, layers=2)
    assert torch_ms > 0 and c_ms > 0
    assert 3 * 16 <= tokens <= 3 * 768


def test_table_has_a_row_per_op(capsys, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "attention_step", lambda repeats: (2.0, 1.0, 123))
    monkeypatch.setattr(cpu_kernels, "LAYERS", 1)
    monkeypatch.setattr(cpu_kernels, "VOCAB", 64)
    cpu_kernels.main(["--repeats", "1"])
    out = capsys.readouterr().out
    assert "| decode attention, 64 seqs, 123 KV tokens, 1 layers | 2.0 | 1.0 | 2.00x | | |" in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| 7 Linears + lm_head")]
    assert len(rows) == 5 and all(float(r[5]) > 0 and r[6].strip().endswith("x") for r in rows)  # the int4 time and ratio


def test_rows_picks_the_linear_rows(capsys, monkeypatch):
    monkeypatch.setattr(cpu_kernels, "attention_step", lambda repeats: (2.0, 1.0, 123))
    monkeypatch.setattr(cpu_kernels, "LAYERS", 1)
    monkeypatch.setattr(cpu_kernels, "VOCAB", 64)
    cpu_kernels.main(["--repeats", "1", "--rows", "1,5"])
    rows = [line.split("|")[1].strip() for line in capsys.readouterr().out.splitlines() if "Linears" in line]
    assert rows == ["7 Linears + lm_head, 1 row", "7 Linears + lm_head, 5 rows"]


@pytest.mark.parametrize("rows", ["1,x", "0,5"])
def test_bad_rows_is_one_line(rows):
    with pytest.raises(SystemExit, match="--rows"):
        cpu_kernels.main(["--rows", rows])
