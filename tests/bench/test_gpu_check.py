"""compress.bench.gpu_check: the dry run end to end, a failing and a hanging phase, and the target evaluation."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from compress.bench import gpu_check
from compress.bench.gpu_check import run_phase
from compress.bench.gpu_targets import PLANS, Target, evaluate, figures, kernel_figures, targets
from compress.bench.gpu_phases import compare
from compress.bench.synthetic_tokenizer import synthetic_tokenizer

DRY = PLANS[True]


def dry_run(tmp_path, *extra):
    cmd = [sys.executable, "-m", "compress.bench.gpu_check", "--dry-run", "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "out" / "gpu_check.json").read_text()), (tmp_path / "out" / "gpu_check.md").read_text()


@pytest.mark.slow  # about 50 s on 2 busy cores: nine phases, each a fresh Python
def test_dry_run_runs_every_phase(tmp_path):
    doc, md = dry_run(tmp_path)
    assert list(doc["phases"]) == list(gpu_check.BUDGETS)
    status = {name: p["status"] for name, p in doc["phases"].items()}
    assert status == dict.fromkeys(gpu_check.BUDGETS, "ok") | {"llmcompressor": "skipped"}, doc["phases"]
    assert {t["figure"] for t in doc["targets"]} == {t.figure for t in targets(DRY)}
    measured = {t["figure"] for t in doc["targets"] if t["status"] != "missing"}
    assert measured == {t.figure for t in targets(DRY)} - {"int4_m1_peak_pct"}  # no peak bandwidth on a CPU
    kernels = doc["phases"]["kernels"]
    ops = {"int4", "int3", "int8+outliers", "int8+outliers g32", "fp8"}
    assert {r["op"] for r in kernels["rows"]} == ops | {"paged attention"}
    assert len(kernels["rows"]) == len(ops) * len(DRY.batch) + len(DRY.attention) and all(r["match"] for r in kernels["rows"])
    assert doc["figures"]["greedy_mismatches"] == 0 and doc["figures"]["kernel_mismatches"] == 0
    assert [len(rows) for rows in doc["phases"]["engine"]["rows"]] == [len(DRY.engine_batches)] * 2
    assert doc["phases"]["cuda_tests"]["tests"] > 0  # collected (and skipped: no CUDA here)
    assert md.startswith("# GPU check (DRY RUN") and "| int4 GEMV, M=1" in md and "## Engine" in md
    assert "===== hf_generate: ok =====" in (tmp_path / "out" / "gpu_check.log").read_text()


def test_a_failing_phase_is_recorded_and_the_run_goes_on(tmp_path):
    doc, md = dry_run(tmp_path, "--phases", "quantize,correctness")  # no checkpoint was written
    assert doc["phases"]["quantize"]["status"] == "error" and doc["phases"]["quantize"]["note"]
    assert doc["phases"]["correctness"] == {"status": "skipped", "note": "needs quantize"}
    assert "| quantize | error |" in md


def test_a_phase_past_its_limit_is_killed_and_keeps_its_status(tmp_path):
    args = argparse.Namespace(work=tmp_path, dry_run=True, llmc_model=None)
    for sub in ("phases", "logs"):
        (tmp_path / sub).mkdir()
    result = run_phase("engine", args, 0.5, os.environ | {"TRITON_INTERPRET": "1"})
    assert result["status"] == "timeout" and result["wall_s"] < 30


def test_evaluate_passes_fails_and_misses():
    wanted = [Target("a", "a", ">=", 3.0), Target("b", "b", ">=", 3.0), Target("c", "c", "<=", 0, ""), Target("d", "d", ">=", 1.0)]
    rows = evaluate({"a": 3.0, "b": 2.99, "c": 1, "d": None}, wanted)
    assert [r["status"] for r in rows] == ["pass", "fail", "fail", "missing"]
    assert rows[0]["want"] == ">= 3x" and evaluate({"c": 0}, wanted[2:3])[0]["status"] == "pass"


def test_kernel_figures_weigh_each_shape_by_its_count_in_a_layer():
    row = dict(op="int4", model="m", M=1, match=True)
    rows = [row | dict(shape="a", per_layer=2, ms=1.0, bf16_ms=4.0, bytes=4e6),
            row | dict(shape="b", per_layer=1, ms=2.0, bf16_ms=2.0, bytes=4e6),
            row | dict(shape="a", M=4, per_layer=2, ms=9.0, bf16_ms=1.0, bytes=1.0, match=False)]
    out = kernel_figures(dict(rows=rows, target_model="m", peak_gbps=4.0))
    assert out["int4_m1_speedup"] == pytest.approx((2 * 4 + 2) / (2 * 1 + 2))  # 10 ms of bf16 vs 4 ms
    assert out["int4_m1_peak_pct"] == pytest.approx(100 * 12e6 / 4 / 1e6 / 4.0)
    assert out["kernel_mismatches"] == 1 and "int3_m1_speedup" not in out


def test_figures_from_the_engine_the_transformers_and_the_greedy_phases():
    bf16 = [dict(batch=1, decode_tok_s=10.0, gpu_bound=100.0), dict(batch=2, decode_tok_s=40.0, gpu_bound=200.0)]
    int4 = [dict(batch=1, decode_tok_s=30.0, gpu_bound=50.0), dict(batch=2, decode_tok_s=60.0, gpu_bound=100.0)]
    phases = dict(engine=dict(status="ok", rows=[bf16, int4]), hf_generate=dict(status="ok", rows=[dict(batch=2, decode_tok_s=8.0)]),
                  correctness=dict(status="ok", prompts=8, equal=6, near_ties=1), cuda_tests=dict(status="fail", failures=2, errors=1))
    out = figures(phases, DRY)
    assert out["engine_int4_vs_bf16_b1"] == 3.0 and out["engine_int4_vs_bf16_big"] == 1.5
    assert out["engine_int4_b1_of_bound"] == 60.0 and out["engine_bf16_vs_hf"] == 5.0
    assert out["greedy_mismatches"] == 1 and out["cuda_test_failures"] == 3
    assert figures({"engine": {"status": "timeout"}}, DRY) == {"kernel_mismatches": None}


def test_greedy_comparison_finds_the_first_difference_and_near_ties():
    top = [{1: -0.1, 2: -0.2}, {3: -0.1, 4: -0.2}]
    assert compare(([1, 3], top), ([1, 3], top)) == dict(equal=True, diverge_at=None, near_tie=None)
    assert compare(([1, 3], top), ([1, 4], top)) == dict(equal=False, diverge_at=1, near_tie=True)
    assert compare(([1, 3], top), ([1, 9], [top[0], {9: -0.1}]))["near_tie"] is False


def test_synthetic_tokenizer_loads_with_the_vocabulary_of_the_random_shapes(tmp_path):
    from transformers import AutoTokenizer

    from compress.bench.random_checkpoint import SHAPES

    tok = AutoTokenizer.from_pretrained(synthetic_tokenizer(tmp_path / "tok"))
    assert len(tok) == SHAPES["tiny"].vocab == SHAPES["llama3-8b"].vocab
    assert tok.encode("t5 t49151", add_special_tokens=False) == [5, 49151] and tok.eos_token_id == 0
    assert json.loads((tmp_path / "tok" / "config.json").read_text()) == {"bos_token_id": 1, "eos_token_id": 0}
