"""The GPU benchmark script runs end to end in --dry-run mode (CPU, interpreter, tiny shapes)."""

import json
import os
import subprocess
import sys


def test_dry_run_writes_rows_and_prints_table(tmp_path):
    out = tmp_path / "bench.json"
    env = os.environ | {"TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "compress.bench.triton_kernels", "--dry-run", "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["rows"]
    ops = {r["op"] for r in rows}
    assert ops == {"int4 g64", "int3 g64", "int8 +16 outliers", "fp8 e4m3", "paged attention", "fused moe int4"}
    assert len(rows) == 4 * 2 + 1 + 2  # 4 Linear kernels x 2 batch sizes, one attention case, MoE x 2 batch sizes
    assert all(r["ms"] > 0 and r["speedup"] > 0 for r in rows)
    assert "| op | model | shape | M |" in proc.stdout


def test_dry_run_refuses_without_interpreter():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "compress.bench.triton_kernels", "--dry-run"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "TRITON_INTERPRET=1" in proc.stderr
