"""What `compress.bench.gpu_check` measures and the bar each figure must clear (issue 27's targets): the GPU
run's plan and the dry run's, and the figures taken from the phases' results."""

from dataclasses import dataclass

from compress.bench import gpu_moe


@dataclass(frozen=True)
class Plan:
    """What one run measures: the GPU run's sizes, or the dry run's tiny ones."""

    shape: str  # compress.bench.random_checkpoint.SHAPES
    linear: dict  # model -> [(out, in, Linears of that shape per decoder layer)]; the first model's M=1 rows meet the targets
    batch: tuple  # kernel bench M
    attention: tuple  # (sequences, context) for paged attention
    heads: tuple  # (heads, kv_heads, head_dim)
    engine_batches: tuple  # `compress bench` batch sizes
    hf_batches: tuple  # transformers generate batch sizes (a subset of engine_batches)
    prompt_len: int
    new_tokens: int
    greedy_prompts: int
    greedy_tokens: int


def layer(h: int, kv: int, mlp: int) -> list:
    return [(h, h, 2), (kv, h, 2), (mlp, h, 2), (h, mlp, 1)]  # q+o, k+v, gate+up, down


PLANS = {  # by dry_run
    False: Plan("llama3-8b", {"llama-3-8b": layer(4096, 1024, 14336), "llama-3-70b": layer(8192, 1024, 28672)},
                (1, 4, 16, 64, 256), ((1, 4096), (16, 1024), (64, 2048)), (32, 8, 128), (1, 8, 32, 64), (1, 32), 64, 64, 8, 64),
    True: Plan("tiny", {"tiny": [(40, 64, 1)]}, (1, 17), ((2, 20),), (4, 2, 16), (1, 2), (1, 2), 8, 4, 8, 8),
}


@dataclass(frozen=True)
class Target:
    name: str
    figure: str  # a key of figures()
    op: str  # ">=" or "<="
    bound: float
    unit: str = "x"


def targets(plan: Plan) -> list[Target]:
    """Issue 27's targets on an H200, labelled with the plan's batch sizes."""
    big, hf = max(plan.engine_batches), max(plan.hf_batches)
    return [
        Target("int4 GEMV, M=1, an 8B layer's Linears vs bf16 matmul", "int4_m1_speedup", ">=", 3.0),
        Target("int4 GEMV, M=1, share of HBM bandwidth", "int4_m1_peak_pct", ">=", 70, "%"),
        Target("int3 GEMV, M=1 vs bf16 matmul", "int3_m1_speedup", ">=", 3.5),
        Target("int8+outliers, M=1 vs bf16 matmul", "int8+outliers_m1_speedup", ">=", 1.7),
        Target("int8+outliers, x's steps per 32 inputs, M=1 vs bf16 matmul", "int8+outliers g32_m1_speedup", ">=", 1.7),
        Target("fp8, M=1 vs bf16 matmul", "fp8_m1_speedup", ">=", 1.7),
        Target("kernel outputs off reference.py (every shape and M)", "kernel_mismatches", "<=", 0, ""),
        Target("engine int4 batch-1 decode, share of its H200 roofline bound", "engine_int4_b1_of_bound", ">=", 60, "%"),
        Target("engine int4 / bf16 decode tok/s, batch 1", "engine_int4_vs_bf16_b1", ">=", 2.5),
        Target(f"engine int4 / bf16 decode tok/s, batch {big}", "engine_int4_vs_bf16_big", ">=", 1.5),
        Target(f"engine bf16 / transformers generate decode tok/s, batch {hf}", "engine_bf16_vs_hf", ">=", 3.0),
        Target("int4 greedy runs parting from the reference path, not at a near tie", "greedy_mismatches", "<=", 0, ""),
        Target("failed CUDA tests", "cuda_test_failures", "<=", 0, ""),
        Target("MoE int4 greedy runs parting, fused kernel vs per-expert path, not at a near tie", "moe_greedy_mismatches", "<=", 0, ""),
        Target("fused MoE outputs off reference.py (Qwen3-30B-A3B layer)", "moe_kernel_mismatches", "<=", 0, ""),
        Target("fused MoE layer / per-expert loop speed, worst of the token counts", "moe_fused_speedup_min", ">=", 1.0),
    ]


def evaluate(figures: dict, wanted: list[Target]) -> list[dict]:
    """One row per target: the measured figure and pass / fail, or missing when nothing measured it."""
    rows = []
    for t in wanted:
        value = figures.get(t.figure)
        ok = value is not None and (value >= t.bound if t.op == ">=" else value <= t.bound)
        rows.append(dict(target=t.name, figure=t.figure, value=value, want=f"{t.op} {t.bound:g}{t.unit}", unit=t.unit,
                         status="missing" if value is None else "pass" if ok else "fail"))
    return rows


def kernel_figures(result: dict) -> dict:
    """Per op at M=1 over one decoder layer of the first model (each shape counted as often as the layer has it):
    bf16 time / kernel time and the share of peak bandwidth; and the number of outputs off the reference."""
    rows = result.get("rows") or []
    out = {"kernel_mismatches": sum(not r["match"] for r in rows) if rows else None}
    for op in ("int4", "int3", "int8+outliers", "int8+outliers g32", "fp8"):
        rs = [r for r in rows if r["op"] == op and r["model"] == result.get("target_model") and r["M"] == 1]
        if rs:
            ms = sum(r["per_layer"] * r["ms"] for r in rs)
            out[f"{op}_m1_speedup"] = sum(r["per_layer"] * r["bf16_ms"] for r in rs) / ms
            if result.get("peak_gbps"):
                out[f"{op}_m1_peak_pct"] = 100 * sum(r["per_layer"] * r["bytes"] for r in rs) / ms / 1e6 / result["peak_gbps"]
    return out


def at_batch(rows: list[dict], batch: int) -> dict:
    return next((r for r in rows if r["batch"] == batch), {})


def figures(phases: dict, plan: Plan) -> dict:
    """The numbers the targets compare, from the phases' results; a figure no phase gave is absent."""
    out = kernel_figures(phases.get("kernels", {})) | gpu_moe.figures(phases.get("moe", {}))
    sweep = phases.get("engine", {}).get("rows") or []
    if len(sweep) == 2:  # bf16, then int4 (--compare)
        (b1, i1), big = [at_batch(rows, 1) for rows in sweep], [at_batch(rows, max(plan.engine_batches)) for rows in sweep]
        if b1 and i1:
            out["engine_int4_vs_bf16_b1"] = i1["decode_tok_s"] / b1["decode_tok_s"]
            out["engine_int4_b1_of_bound"] = 100 * i1["decode_tok_s"] / i1["gpu_bound"]
        if all(big):
            out["engine_int4_vs_bf16_big"] = big[1]["decode_tok_s"] / big[0]["decode_tok_s"]
        hf = at_batch(phases.get("hf_generate", {}).get("rows") or [], max(plan.hf_batches))
        if hf and at_batch(sweep[0], hf["batch"]):
            out["engine_bf16_vs_hf"] = at_batch(sweep[0], hf["batch"])["decode_tok_s"] / hf["decode_tok_s"]
    greedy, tests = phases.get("correctness", {}), phases.get("cuda_tests", {})
    if greedy.get("status") == "ok":
        out["greedy_mismatches"] = greedy["prompts"] - greedy["equal"] - greedy["near_ties"]
    if tests.get("status") in ("ok", "fail") and "failures" in tests:
        out["cuda_test_failures"] = tests["failures"] + tests["errors"]
    return out
