"""The CPU kernels against the torch paths they replace, on SmolLM2-135M's shapes, in one run.

    OMP_NUM_THREADS=1 python -m compress.bench.cpu_kernels [--repeats 5] [--rows 1,8,16,64,512]

Decode attention: one step of 64 sequences with seeded contexts of 16-768 tokens (the mixed
workload's busiest step), their blocks scattered over the pool as after a while of serving, 30
layers: ``PagedAttention`` with the C kernel vs its torch path (grouped gather + SDPA). Linears:
a step's 210 Linears and the lm_head at 1, 8, 16, 64 and 512 rows (batch-1 decode to a prompt
chunk; ``--rows`` picks others, e.g. 5 for a batch-1 speculative verification with 4
drafts): ``linear_cpu`` (the C GEMM, weights packed once) vs torch's GEMM, and the same step
with the 210 Linears as int4 g64 weights in ``nibble_linear_cpu``'s 4-bit panels (the lm_head stays
fp32, as in our exports), which is how the engine runs an int4/int3 checkpoint on CPU. Times are the
fastest of ``--repeats`` (ms per step); the ratios are torch / C and C fp32 / C int4.
"""

import argparse
import random
import time

import torch
import torch.nn.functional as F

from compress.kernels import linear_cpu, nibble_linear_cpu, paged_attention_cpu
from compress.quant.primitives import IntSpec, qparams, quantize
from compress.runtime.attention import AttentionMetadata, PagedAttention

LAYERS, HEADS, KV_HEADS, HEAD_DIM, HIDDEN, MLP, VOCAB = 30, 9, 3, 64, 576, 1536, 49152
LINEARS = [(HIDDEN, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (KV_HEADS * HEAD_DIM, HIDDEN), (HIDDEN, HIDDEN),
           (MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]  # q, k, v, o, gate, up, down: [out, in]
BLOCK = 16


def fastest(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


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
    ms = {}
    for use_kernel in (False, True):
        backend = PagedAttention(kv, meta, None, cpu_kernel=use_kernel)
        ms[use_kernel] = fastest(lambda: [backend(layer, q, k, v) for layer in range(layers)], repeats)
    return ms[False], ms[True], sum(contexts)


def int4_panels(w: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """w [O, I] rounded to asymmetric int4 g64 (RTN), in 4-bit panels."""
    spec = IntSpec(4, 64)
    scale, zero = qparams(w, spec)
    return nibble_linear_cpu.pack(quantize(w, scale, zero, spec), scale, zero)


def linear_step(rows: int, weights: list[torch.Tensor], panels: list[torch.Tensor], nibbles: list, repeats: int) -> tuple[float, float, float]:
    """ms per step's matmuls at `rows` rows: torch GEMM, C GEMM, and C int4 GEMM for the Linears (lm_head: C GEMM)."""
    x = {i: torch.randn(rows, i) for i in (HIDDEN, MLP)}
    torch_ms = fastest(lambda: [F.linear(x[w.shape[1]], w) for w in weights], repeats)
    c_ms = fastest(lambda: [linear_cpu.linear(x[w.shape[1]], p, w.shape[0]) for w, p in zip(weights, panels)], repeats)

    def int4_step():
        for w, n in zip(weights, nibbles):
            nibble_linear_cpu.linear(x[w.shape[1]], n, w.shape[0])
        linear_cpu.linear(x[HIDDEN], panels[-1], VOCAB)

    return torch_ms, c_ms, fastest(int4_step, repeats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", default="1,8,16,64,512", help="comma-separated row counts to time the Linears at")
    args = parser.parse_args(argv)
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        raise SystemExit(f"error: --rows {args.rows!r} must be comma-separated whole numbers, e.g. 1,5") from None
    if min(row_counts) < 1:
        raise SystemExit(f"error: --rows {args.rows!r}: every row count must be at least 1")
    if None in (paged_attention_cpu.load(), linear_cpu.load(), nibble_linear_cpu.load()):
        raise SystemExit("error: the CPU kernels do not build here (no working C compiler; set CC)")
    print(f"{torch.get_num_threads()} threads, fastest of {args.repeats}")
    print("| op | torch (ms) | C kernel (ms) | torch / C | C int4 (ms) | C / C int4 |\n|---|---:|---:|---:|---:|---:|")
    torch_ms, c_ms, tokens = attention_step(args.repeats)
    print(f"| decode attention, 64 seqs, {tokens} KV tokens, {LAYERS} layers | {torch_ms:.1f} | {c_ms:.1f} | {torch_ms / c_ms:.2f}x | | |")
    gen = torch.Generator().manual_seed(2)
    weights = [torch.randn(o, i, generator=gen) for _ in range(LAYERS) for o, i in LINEARS]
    weights.append(torch.randn(VOCAB, HIDDEN, generator=gen))  # the lm_head
    panels = [linear_cpu.pack(w) for w in weights]
    nibbles = [int4_panels(w) for w in weights[:-1]]
    for rows in row_counts:
        torch_ms, c_ms, int4_ms = linear_step(rows, weights, panels, nibbles, args.repeats)
        print(f"| {len(weights) - 1} Linears + lm_head, {rows} row{'s' if rows > 1 else ''} | {torch_ms:.1f} | {c_ms:.1f} "
              f"| {torch_ms / c_ms:.2f}x | {int4_ms:.1f} | {c_ms / int4_ms:.2f}x |")


if __name__ == "__main__":
    main()
