"""Kernel benchmark: each Triton kernel vs fp16 torch on Llama Linear shapes; paged attention vs SDPA; fused MoE.

    python -m compress.bench.triton_kernels --out bench.json            # CUDA GPU, a few minutes
    TRITON_INTERPRET=1 python -m compress.bench.triton_kernels --dry-run --out bench.json   # CPU, tiny shapes

For every (model, Linear shape [O, I], M) it times each kernel and ``torch.matmul`` in fp16 on the
same shapes in the same run, and reports the speed-up (fp16 time / kernel time) and the achieved
memory bandwidth (bytes the op must move / time) as a share of the GPU's peak. Paged attention is
timed against ``scaled_dot_product_attention`` on the same keys and values laid out densely, and the
fused int4 MoE against the same experts in fp16 run one by one in torch (``compress/model/moe.py``'s loop).
``--dry-run`` runs everything on tiny shapes under the Triton interpreter, to prove the script
works end to end; its times mean nothing.
"""

import argparse
import json
import time

import torch
import triton

from compress.bench.operands import OUTLIERS, attention_operands, int8_operands, int_operands, moe_operands
from compress.kernels.checks import interpreting
from compress.kernels.dequant_matmul import dequant_matmul
from compress.kernels.fp8_matmul import fp8_matmul
from compress.kernels.fused_moe import fused_moe_int4
from compress.kernels.int8_matmul import int8_outlier_matmul
from compress.kernels.paged_attention import paged_attention

LINEAR_SHAPES = {  # model -> distinct Linear [out_features, in_features]
    "llama-2-7b": [(4096, 4096), (11008, 4096), (4096, 11008)],
    "llama-3-8b": [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)],
}
BATCH = [1, 4, 16, 64, 256]
ATTENTION = [(1, 4096), (16, 1024), (64, 2048)]  # (sequences, context length): Llama-3-8B heads
DRY_LINEAR = {"tiny": [(40, 64)]}
DRY_BATCH = [1, 17]
DRY_ATTENTION = [(2, 20)]
MOE = {"qwen3-30b-a3b": (2048, 768, 128, 8)}  # model -> (hidden C, expert width I, experts E, top-k K)
DRY_MOE = {"tiny": (64, 32, 4, 2)}
PEAK_GBPS = {"H200": 4800, "H100 SXM": 3350, "H100 NVL": 3900, "H100": 2000, "A100": 2039, "L40S": 864, "A10": 600}


def peak_gbps(device: torch.device) -> float | None:
    """Data-sheet HBM bandwidth of the GPU (first name that matches), None on CPU or unknown GPUs."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((gbps for key, gbps in PEAK_GBPS.items() if key in name), None)


def milliseconds(fn) -> float:
    if torch.cuda.is_available():
        return triton.testing.do_bench(fn, warmup=10, rep=40)
    fn()
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def linear_ops(o: int, i: int, device) -> dict:
    """kernel name -> (fn(x) -> y, weight bytes it reads)."""
    ops = {}
    for bits in (4, 3):
        packed, scale, zero = int_operands(o, i, bits, device)
        ops[f"int{bits} g{i // scale.shape[1]}"] = (lambda x, p=packed, s=scale, z=zero, b=bits: dequant_matmul(x, p, s, z, b),
                                     (packed.numel() + zero.numel()) * 4 + scale.numel() * 2)
    a8 = int8_operands(o, i, device, torch.float16)
    ops[f"int8 +{OUTLIERS} outliers"] = (lambda x: int8_outlier_matmul(x, *a8), o * i + o * OUTLIERS * 2)
    w_fp8 = torch.randn(o, i, device=device).to(torch.float8_e4m3fn)
    ops["fp8 e4m3"] = (lambda x: fp8_matmul(x, w_fp8, a8[1]), o * i)
    return ops


def bench_linear(model: str, o: int, i: int, batch: list[int], device, peak: float | None) -> list[dict]:
    rows = []
    w16 = torch.randn(o, i, device=device, dtype=torch.float16)  # [O, I]
    ops = linear_ops(o, i, device)
    for m in batch:
        x = torch.randn(m, i, device=device, dtype=torch.float16)  # [M, I]
        fp16_ms = milliseconds(lambda: torch.matmul(x, w16.t()))
        for name, (fn, weight_bytes) in ops.items():
            ms = milliseconds(lambda: fn(x))
            gbps = (weight_bytes + (m * i + m * o) * 2) / ms / 1e6
            rows.append(dict(op=name, model=model, shape=f"{o}x{i}", M=m, ms=ms, fp16_ms=fp16_ms,
                             speedup=fp16_ms / ms, gbps=gbps, peak_pct=None if peak is None else 100 * gbps / peak))
    return rows


def bench_attention(seqs: int, context: int, heads: int, kv_heads: int, dim: int, device, peak) -> dict:
    paged, k, v = attention_operands(seqs, context, heads, kv_heads, dim, device)
    q4 = paged[0][:, :, None]  # [S, H, 1, D]
    sdpa_ms = milliseconds(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k, v, enable_gqa=True))
    ms = milliseconds(lambda: paged_attention(*paged))
    gbps = 2 * k.numel() * 2 / ms / 1e6
    return dict(op="paged attention", model=f"H{heads}/KV{kv_heads}/D{dim}", shape=f"ctx {context}", M=seqs, ms=ms,
                fp16_ms=sdpa_ms, speedup=sdpa_ms / ms, gbps=gbps, peak_pct=None if peak is None else 100 * gbps / peak)


def moe_fp16(x, w13, w2, ids, weights):
    """The baseline: each chosen expert's fp16 MLP [E, 2I, C], [E, C, I] on its own tokens, weighted and summed."""
    out = torch.zeros_like(x)  # [T, C]
    for e in ids.unique().tolist():
        token, k = (ids == e).nonzero(as_tuple=True)
        gate, up = (x[token] @ w13[e].t()).chunk(2, -1)
        out.index_add_(0, token, (torch.nn.functional.silu(gate) * up) @ w2[e].t() * weights[token, k, None].to(x.dtype))
    return out


def bench_moe(model: str, hidden: int, width: int, experts: int, top_k: int, batch: list[int], device, peak) -> list[dict]:
    gate_up, down = moe_operands(experts, 2 * width, hidden, device), moe_operands(experts, hidden, width, device)
    w13 = torch.randn(experts, 2 * width, hidden, device=device, dtype=torch.float16)
    w2 = torch.randn(experts, hidden, width, device=device, dtype=torch.float16)
    expert_bytes = sum(t.numel() * t.element_size() for t in (*gate_up, *down)) / experts
    rows = []
    for m in batch:
        x = torch.randn(m, hidden, device=device, dtype=torch.float16)  # [T, C]
        weights, ids = torch.rand(m, experts, device=device).softmax(-1).topk(top_k)  # [T, K] each
        fp16_ms = milliseconds(lambda: moe_fp16(x, w13, w2, ids, weights))
        ms = milliseconds(lambda: fused_moe_int4(x, gate_up, down, ids, weights))
        gbps = (ids.unique().numel() * expert_bytes + 2 * m * hidden * 2) / ms / 1e6
        rows.append(dict(op="fused moe int4", model=model, shape=f"E{experts} C{hidden} I{width} top{top_k}", M=m,
                         ms=ms, fp16_ms=fp16_ms, speedup=fp16_ms / ms, gbps=gbps, peak_pct=None if peak is None else 100 * gbps / peak))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| op | model | shape | M | ms | baseline ms | speed-up | GB/s | % peak |", "|" + "---|" * 9]
    for r in rows:
        pct = "n/a" if r["peak_pct"] is None else f"{r['peak_pct']:.0f}"
        lines.append(f"| {r['op']} | {r['model']} | {r['shape']} | {r['M']} | {r['ms']:.4f} | {r['fp16_ms']:.4f} | "
                     f"{r['speedup']:.2f}x | {r['gbps']:.0f} | {pct} |")
    return "\n".join(lines)


def run(dry_run: bool) -> list[dict]:
    device = torch.device("cpu" if dry_run else "cuda")
    peak = peak_gbps(device)
    linear, batch, attention, moe = (DRY_LINEAR, DRY_BATCH, DRY_ATTENTION, DRY_MOE) if dry_run else (LINEAR_SHAPES, BATCH, ATTENTION, MOE)
    heads = (4, 2, 16) if dry_run else (32, 8, 128)
    rows = [row for model, shapes in linear.items() for o, i in shapes for row in bench_linear(model, o, i, batch, device, peak)]
    rows += [bench_attention(s, c, *heads, device, peak) for s, c in attention]
    rows += [row for model, shape in moe.items() for row in bench_moe(model, *shape, batch, device, peak)]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench.json", help="where to write the rows as JSON")
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    args = parser.parse_args(argv)
    if args.dry_run and not interpreting():
        parser.error("--dry-run needs TRITON_INTERPRET=1 in the environment (set before Python starts)")
    if not args.dry_run and (interpreting() or not torch.cuda.is_available()):
        parser.error("needs a CUDA GPU and TRITON_INTERPRET unset; use --dry-run (with TRITON_INTERPRET=1) on CPU")
    rows = run(args.dry_run)
    device = "cpu (interpreter)" if args.dry_run else torch.cuda.get_device_name()
    with open(args.out, "w") as f:
        json.dump({"device": device, "torch": torch.__version__, "triton": triton.__version__, "rows": rows}, f, indent=1)
    print(f"device: {device}\n\n{table(rows)}")


if __name__ == "__main__":
    main()
