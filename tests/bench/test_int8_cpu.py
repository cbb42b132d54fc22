"""compress.bench.int8_cpu: one table row per shape and steps, both paths timed, the reference's weight copy seen."""

import pytest
from click.testing import CliRunner

from compress.bench import int8_cpu
from compress.bench.cpu_kernels import SHAPES
from compress.kernels import int8_rows_cpu


@pytest.mark.skipif(int8_rows_cpu.load() is None, reason="no C compiler for int8_rows_cpu")
def test_one_row_per_shape_and_steps():
    out = CliRunner().invoke(int8_cpu.main, ["--shapes", "smollm2", "--rows", "1", "--repeats", "1"])
    assert out.exit_code == 0, out.output
    rows = [line.split("|")[1:-1] for line in out.output.splitlines() if line.startswith("| ") and "x" in line.split("|")[1]]
    rows = [r for r in rows if r[0].strip() != "O x I"]
    assert len(rows) == 2 * len(SHAPES["smollm2"])
    assert [r[2].strip() for r in rows[:2]] == ["per token", "per 32"]
    for r in rows:
        assert float(r[3]) > 0 and float(r[4]) > 0
    head = next(r for r in rows if r[0].strip() == "49152 x 576" and r[2].strip() == "per 32")
    assert float(head[6]) > 100 > float(head[7])  # the reference widens the 27 MiB of codes to fp32; the C path does not
