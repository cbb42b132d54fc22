"""The CPU kernels against torch on a model's shapes, and the choice the engine makes between them.

    OMP_NUM_THREADS=2 python -m compress.bench.cpu_kernels [--shapes smollm2|smollm2-joined|llama3-8b] [--repeats 5] [--rows 1,5]

Prints the host (CPU, vector extensions, threads, how the C kernels were built), then
- decode attention: one step of 64 sequences with seeded contexts of 16-768 tokens (the mixed
  workload's busiest step), their blocks scattered over the pool, 30 layers: ``PagedAttention``
  with the C kernel vs its torch path (grouped gather + SDPA); then the engine's per-bucket timing
  of the same (``compress/runtime/cpu_kernels.py``).
- per Linear shape, fp32 and int4 g64: torch's time / the C kernel's at each row bucket the engine
  times at start (``compress/runtime/kernel_choice.py``, made afresh here, not read from the cache),
  with the kernel the engine chooses (C, t or p; as the engine, a kernel other than the preferred one
  must win two timings, ``kernel_choice.confirmed``). fp32's candidates are our C GEMM, torch's ("t")
  and the panel GEMM ("p", ``kernels/panel_cpu.py``); int4's the 4-bit C GEMM, dequantize-into-scratch
  + torch's GEMM ("t") and the panel GEMM dequantizing into its panels ("p"); the ratio is torch's
  path over C.
- the check: every row count from 1 to --max-rows that the buckets and their midpoints give, timed
  again (a second, independent pass): torch's fp32 GEMM on the dense weight against the kernel the
  engine runs at that row count; the worst ratio per shape (the target: >= 0.95 for fp32; a ratio
  below it must repeat in three timings), and for fp32 the worst where the engine runs torch itself
  (torch against torch: the noise of a timing on this machine). For
  int4, torch's side holds the dense fp32 weight (8x the memory), so a ratio below 1 there is what
  keeping 4 bits costs against a dense model.
- a whole step's Linears (SmolLM2's 210 and the lm_head, at --step-rows rows; shapes whose model fits
  in 2 GiB of fp32): torch's nn.Linears against the engine's modules with the choices above, fp32
  and int4.
``--rows`` times only those row counts (no check, no step table). Times are the fastest of
``--repeats`` passes, and only passes that repeat within 10% count (kernel_choice.NOISE; a busy
machine's cells read "noisy").
"""

import argparse
import platform
import random
import time

import torch
from torch import nn

from compress.host import cpu_model
from compress.kernels import cpu_build, linear_cpu, nibble_linear_cpu, nibble_q8_cpu, paged_attention_cpu
from compress.model.config import ModelConfig
from compress.model.attention import AttentionSpec
from compress.runtime.attention import AttentionMetadata, PagedAttention
from compress.runtime.cpu_kernels import decode_candidates
from compress.runtime.cpu_linears import Group, use_plan
from compress.runtime.cpu_modules import CpuLinear, NibbleLinear, Scratch
from compress.runtime.kernel_choice import C, PANEL, TORCH, Plan, buckets, confirmed, decide, time_candidates
from compress.runtime.linear_timing import ROTATION_BYTES, SLICE_MIN, candidates

# (out, in, how many in the model): q/o, k/v, gate/up, down, lm_head; "-joined": as the engine runs them, q/k/v and
# gate/up joined into one Linear each (runtime/cpu_fusion.py)
SHAPES = {
    "smollm2": [(576, 576, 60), (192, 576, 60), (1536, 576, 60), (576, 1536, 30), (49152, 576, 1)],
    "smollm2-joined": [(960, 576, 30), (576, 576, 30), (3072, 576, 30), (576, 1536, 30), (49152, 576, 1)],
    "llama3-8b": [(4096, 4096, 64), (1024, 4096, 64), (14336, 4096, 64), (4096, 14336, 32), (128256, 4096, 1)],
}
LAYERS, HEADS, KV_HEADS, HEAD_DIM, BLOCK = 30, 9, 3, 64, 16  # SmolLM2-135M's attention
GROUP = 64  # int4 group size
STEP_BYTES = 2 << 30  # the whole-step table holds every Linear of the model in fp32: only up to this
LETTERS = {C: "C", TORCH: "t", PANEL: "p"}  # the choice in a table cell


def host() -> str:
    """The CPU (model name, vector extensions), threads, torch, and the C kernels' build and vector width."""
    flags = cpu_build.machine().split()
    simd = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "asimd", "sve") if f in flags]
    build = " ".join(["-march=native", *cpu_build.ISAS[cpu_build.isa()]])
    return (f"host: {platform.machine()}, {cpu_model()}; "
            f"{' '.join(simd) or 'no wide vectors'}; {torch.get_num_threads()} threads; torch {torch.__version__}; "
            f"C kernels {build} (COMPRESS_CPU_ISA={cpu_build.isa()}), {linear_cpu.load().vector_width()}-float vectors, "
            f"int8 dot product {nibble_q8_cpu.isa()}")


def attention_step(repeats: int, seqs: int = 64, layers: int = LAYERS) -> tuple[float, float, int]:
    """ms per decode step over `layers` layers, torch path and C kernel, and the step's KV tokens."""
    rng = random.Random(0)
    contexts = [rng.randint(16, 768) for _ in range(seqs)]
    pool = 2 * sum(-(-c // BLOCK) for c in contexts)  # half of it in use, scattered
    kv = torch.randn(2, layers, pool, BLOCK, KV_HEADS, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    order = torch.randperm(pool, generator=torch.Generator().manual_seed(1)).tolist()
    tables, used = [], 0
    for c in contexts:
        tables.append(order[used:used + -(-c // BLOCK)])
        used += len(tables[-1])
    meta = AttentionMetadata.build([c - 1 for c in contexts], [1] * seqs, tables, BLOCK, "cpu")
    q, k, v = torch.randn(1, seqs, HEADS, HEAD_DIM), torch.randn(1, seqs, KV_HEADS, HEAD_DIM), torch.randn(1, seqs, KV_HEADS, HEAD_DIM)
    backends = {use: PagedAttention(kv, meta, AttentionSpec(), cpu_kernel=use) for use in (False, True)}
    ms = settled({use: lambda b=b: [b(layer, q, k, v) for layer in range(layers)] for use, b in backends.items()}, repeats) or {}
    return ms.get(False, float("nan")), ms.get(True, float("nan")), sum(contexts)


def groups(out_features: int, in_features: int, count: int, gen: torch.Generator) -> tuple[Group, Group]:
    """An fp32 and an int4 group of random weights, as many and as many rows as a timing pass reads."""
    rows = min(out_features, max(SLICE_MIN, ROTATION_BYTES // (4 * in_features)))
    n = min(count, -(-ROTATION_BYTES // (4 * rows * in_features)))
    fp32 = Group([CpuLinear(torch.randn(rows, in_features, generator=gen), None) for _ in range(n)])
    scratch, g = Scratch(), in_features // GROUP
    int4 = Group([NibbleLinear.from_codes(torch.randint(0, 16, (rows, in_features), generator=gen, dtype=torch.uint8),
                                          torch.rand(rows, g, generator=gen) * 0.01, torch.randint(0, 16, (rows, g), generator=gen),
                                          None, scratch)
                  for _ in range(n)])
    return fp32, int4


def settled(runs: dict, repeats: int, tries: int = 4) -> dict[str, float] | None:
    """time_candidates until its fastest passes repeat (see kernel_choice.NOISE), at most `tries` times."""
    for _ in range(tries):
        ms = time_candidates(runs, repeats)
        if ms is not None:
            return ms
    return None


def choice_row(label: str, group: Group, rows: list[int], repeats: int) -> tuple[str, Plan | None]:
    """A table row: torch / C and the engine's choice at each row count ("noisy": timings that never
    repeated, the preferred kernel); and the engine's Plan from them (None unless rows are buckets from 1)."""
    cells, kernels, times = [], [], []
    for r in rows:
        ms = confirmed(lambda r: settled(candidates(group, r), repeats), r, group.preferred)
        kernels.append(group.preferred if ms is None else decide(ms, group.preferred))
        times.append(ms)
        cells.append("noisy" if ms is None else f"{ms[TORCH] / ms[C]:.2f} {LETTERS[kernels[-1]]}")
    plan = Plan(tuple(rows), tuple(kernels), tuple(times), group.preferred) if rows == buckets(rows[-1]) else None
    return f"| {label} | " + " | ".join(cells) + " |", plan


def check_rows(max_rows: int) -> list[int]:
    """The buckets and the row counts halfway between them."""
    b = buckets(max_rows)
    return sorted(set(b) | {(lo + hi) // 2 for lo, hi in zip(b, b[1:])})


def check_ratio(group: Group, dense: Group, kernel: str, rows: int, repeats: int) -> float | None:
    """torch fp32's time / the engine kernel's at `rows`; a ratio below 0.95 must hold in three timings
    (the largest of them counts: a slowdown is real only if it repeats, as the engine's switches must)."""
    ratios = []
    for _ in range(3):
        ms = settled({"torch": candidates(dense, rows)[TORCH], "engine": candidates(group, rows)[kernel]}, repeats)
        if ms is not None:
            ratios.append(ms["torch"] / ms["engine"])
        if ratios and max(ratios) >= 0.95:
            break
    return max(ratios, default=None)


def check_row(label: str, group: Group, dense: Group, plan: Plan, rows: list[int], repeats: int) -> str:
    """torch fp32 / the engine's kernel at every row count (as the engine picks it: plan.choices()),
    and for fp32 the worst where the engine runs torch itself: the noise of a timing."""
    ratios, noisy, itself, choices = {}, [], [], plan.choices()
    for r in rows:
        kernel = choices[min(r, len(choices) - 1)]
        ratio = check_ratio(group, dense, kernel, r, repeats)
        if ratio is None:
            noisy.append(r)
            continue
        ratios[r] = ratio
        if group is dense and kernel == TORCH:
            itself.append(ratio)
    if not ratios:
        return f"| {label} | noisy | noisy | | | {len(noisy)} |"
    worst = min(ratios, key=ratios.get)
    below = [r for r, x in ratios.items() if x < 0.95]
    noise = f"{min(itself):.2f}" if itself else ""
    return (f"| {label} | {ratios[worst]:.2f} at {worst} | {sorted(ratios.values())[len(ratios) // 2]:.2f} "
            f"| {', '.join(map(str, below)) or 'none'} | {noise} | {len(noisy)} |")


def step_modules(shapes: list[tuple[int, int, int]], plans: dict[tuple[int, int, str], Plan], gen: torch.Generator):
    """A whole step's Linears at full size: torch's nn.Linears, the engine's CpuLinears over the same weights
    and NibbleLinears (the lm_head, the last shape, stays fp32 as in our exports), with the choices made."""
    dense, fp32, int4, scratch = [], [], [], Scratch()
    for n, (out_features, in_features, count) in enumerate(shapes):
        for _ in range(count):
            dense.append(nn.Linear(in_features, out_features, bias=False, device="meta"))
            dense[-1].weight = nn.Parameter(torch.randn(out_features, in_features, generator=gen), requires_grad=False)
            fp32.append(CpuLinear(dense[-1].weight, None))
            use_plan([fp32[-1]], plans[out_features, in_features, "fp32"])
            if n == len(shapes) - 1:
                int4.append(fp32[-1])
                continue
            g = in_features // GROUP
            int4.append(NibbleLinear.from_codes(torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8),
                                                torch.rand(out_features, g, generator=gen) * 0.01,
                                                torch.randint(0, 16, (out_features, g), generator=gen), None, scratch))
            use_plan([int4[-1]], plans[out_features, in_features, "int4"])
    return dense, fp32, int4


def step_row(rows: int, dense: list, fp32: list, int4: list, repeats: int) -> str:
    """One row of the step table: torch's nn.Linears (what transformers runs) against the engine's modules."""
    x = {m.in_features: torch.randn(rows, m.in_features) for m in dense}
    ms = settled({name: lambda ms=modules: [m(x[m.in_features]) for m in ms]
                  for name, modules in (("torch", dense), ("fp32", fp32), ("int4", int4))}, repeats)
    if ms is None:
        return f"| {rows} | noisy | | | | |"
    return (f"| {rows} | {ms['torch']:.1f} | {ms['fp32']:.1f} | {ms['torch'] / ms['fp32']:.2f}x | {ms['int4']:.1f} "
            f"| {ms['torch'] / ms['int4']:.2f}x |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="smollm2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-rows", type=int, default=512, help="the engine's max_num_batched_tokens")
    parser.add_argument("--rows", help="comma-separated row counts to time instead of the engine's buckets (no check, no step)")
    parser.add_argument("--step-rows", default="1,8,16,64,512", help="row counts of the whole-step table")
    args = parser.parse_args(argv)
    try:
        row_counts = [int(r) for r in args.rows.split(",")] if args.rows else buckets(args.max_rows)
        step_rows = [int(r) for r in args.step_rows.split(",")]
    except ValueError:
        raise SystemExit("error: --rows and --step-rows must be comma-separated whole numbers, e.g. 1,5") from None
    if min(row_counts + step_rows) < 1 or args.repeats < 1:
        raise SystemExit("error: every row count (--rows, --step-rows, --max-rows) and --repeats must be at least 1")
    if None in (paged_attention_cpu.load(), linear_cpu.load(), nibble_linear_cpu.load()):
        raise SystemExit("error: the CPU kernels do not build here (no working C compiler; set CC)")
    start = time.monotonic()
    print(host())
    torch_ms, c_ms, tokens = attention_step(args.repeats)
    print(f"decode attention, 64 seqs, {tokens} KV tokens, {LAYERS} layers: torch {torch_ms:.1f} ms, C {c_ms:.1f} ms, "
          f"torch / C {torch_ms / c_ms:.2f}x")
    cfg = ModelConfig("llama", 1, HEADS * HEAD_DIM, 1, 1, HEADS, KV_HEADS, HEAD_DIM)
    seqs = buckets(64)
    cells = []
    for r in seqs:
        ms = confirmed(lambda r: settled(decode_candidates(cfg, BLOCK, r), args.repeats), r, TORCH)
        cells.append(f"{r}: noisy" if ms is None else f"{r}: {ms[TORCH] / ms[C]:.2f} {'C' if decide(ms, TORCH) == C else 't'}")
    print("decode attention per bucket, torch / C and the choice (one layer, up to 256 tokens each): " + ", ".join(cells))
    head = "| Linear (in the model) | " + " | ".join(map(str, row_counts)) + " |\n|---|" + "---:|" * len(row_counts)
    print(f"\ntorch / C per row count, and the engine's choice (C, t or p), fastest of {args.repeats} interleaved passes\n{head}")
    gen, made, plans = torch.Generator().manual_seed(2), [], {}
    for out_features, in_features, count in SHAPES[args.shapes]:
        fp32, int4 = groups(out_features, in_features, count, gen)
        for key, kind, group in (("fp32", "fp32", fp32), ("int4", f"int4 g{GROUP}", int4)):
            label = f"{out_features}x{in_features} {kind} ({count})"
            line, plan = choice_row(label, group, row_counts, args.repeats)
            print(line, flush=True)
            made.append((label, group, fp32, plan))
            plans[out_features, in_features, key] = plan
    shapes = SHAPES[args.shapes]
    if not args.rows and 4 * sum(o * i * n for o, i, n in shapes) <= STEP_BYTES:
        print(f"\na whole step's {sum(n for *_, n in shapes) - 1} Linears + lm_head (ms): torch fp32, the engine with the choices "
              f"above, fp32 and int4 g{GROUP} (lm_head fp32)\n| rows | torch | engine fp32 | torch / engine | engine int4 "
              f"| torch fp32 / engine int4 |\n|---:|---:|---:|---:|---:|---:|")
        dense, fp32_step, int4_step = step_modules(shapes, plans, gen)
        for r in step_rows:
            print(step_row(r, dense, fp32_step, int4_step, args.repeats), flush=True)
        del dense, fp32_step, int4_step
    if not args.rows:
        print("\ncheck, timed again: torch fp32 / the engine's kernel at every bucket and halfway between\n"
              "| Linear | worst | median | row counts below 0.95 (in 3 timings) | torch vs itself, worst | too noisy to time |\n"
              "|---|---:|---:|---|---:|---:|")
        for label, group, fp32, plan in made:
            print(check_row(label, group, fp32, plan, check_rows(args.max_rows), args.repeats), flush=True)
    print(f"\n({time.monotonic() - start:.0f} s)")


if __name__ == "__main__":
    main()
