"""compress.bench.gpu_moe: the GPU check's MoE phase in its dry run, and its figures from what a phase saved."""

import json
import os
import subprocess
import sys

import pytest

from compress.bench.gpu_targets import PLANS, targets
from compress.bench.gpu_moe import figures, markdown

GREEDY = [dict(dtype="bfloat16", prompts=8, equal=6, near_ties=1, results=[dict(equal=True, diverge_at=None)] * 6 +
               [dict(equal=False, diverge_at=3)] * 2), dict(dtype="float32", prompts=8, equal=8, near_ties=0, results=[])]
LAYER = dict(experts=128, width=768, hidden=2048, top_k=8, group=128, dtype="bfloat16", fused_ms=1.0, bound=0.016, diff_vs_loop=0.01)
TIMING = [LAYER | dict(tokens=t, loop_ms=ms, speedup=ms, err_vs_reference=0.001, match=t != 64) for t, ms in ((1, 3.0), (8, 2.5), (64, 0.8))]


def test_figures_from_finished_parts():
    assert figures(dict(status="timeout", greedy=GREEDY, timing=TIMING[:2])) == dict(
        moe_greedy_mismatches=1, moe_kernel_mismatches=0, moe_fused_speedup_min=2.5)  # 8 - 6 equal - 1 near tie
    assert figures(dict(status="ok", greedy=GREEDY, timing=TIMING))["moe_kernel_mismatches"] == 1
    assert figures(dict(status="error")) == {} and markdown({}) == []
    assert {"moe_greedy_mismatches", "moe_kernel_mismatches", "moe_fused_speedup_min"} <= {t.figure for t in targets(PLANS[False])}
    md = "\n".join(markdown(dict(model="m", tokens=32, greedy=GREEDY, timing=TIMING)))
    assert "| bfloat16 | 6 of 8 | 1 | [3, 3] |" in md and "| 64 | 0.800 | 1.000 | 0.80x | 0.001 / 0.016 OFF | 0.01 |" in md


@pytest.mark.slow  # ~30 s on 2 busy cores: a tiny MoE written, quantized, decoded twice; a layer timed under the interpreter
def test_dry_run_of_the_moe_phase(tmp_path):
    cmd = [sys.executable, "-m", "compress.bench.gpu_check", "--dry-run", "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), "--phases", "moe"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    moe = doc["phases"]["moe"]
    assert moe["status"] == "ok" and [g["dtype"] for g in moe["greedy"]] == ["float32"]
    assert doc["figures"]["moe_greedy_mismatches"] == 0 and doc["figures"]["moe_kernel_mismatches"] == 0
    assert [r["tokens"] for r in moe["timing"]] == [1, 8] and all(r["diff_vs_loop"] <= r["bound"] for r in moe["timing"])
