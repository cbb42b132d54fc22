"""The GPU check's mixture-of-experts pieces (the ``moe`` phase of compress/bench/gpu_phases.py, docs/gpu-check.md).

* A tiny random Qwen3-MoE checkpoint (``TINY``) that the phase quantizes to int4 (RTN) and decodes greedily twice in
  one engine: with the fused Triton kernel (runtime/fused_experts.py, what a CUDA engine runs) and with every block
  on the per-expert path (``block.fused = None``: one dequant-matmul per chosen expert's gate, up and down).
* One MoE layer of Qwen3-30B-A3B's shape (hidden 2048, 128 int4 experts of 768, 8 per token, g128, symmetric as
  its exports are) timed both ways at 1, 8 and 64 tokens: the block's own forward (router, top-k, experts), the
  fused output checked against ``reference.fused_moe_int4`` within the kernel tests' bound.

The dry run (CPU) emulates the CUDA engine: no CPU kernel swap, and the fused kernel under TRITON_INTERPRET=1.
"""

import math
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from compress.bench.random_checkpoint import SHAPES, Shape, hf_config, write_random_checkpoint
from compress.bench.triton_kernels import milliseconds
from compress.kernels import reference
from compress.model.config import ModelConfig
from compress.model.moe import SparseMoe
from compress.quant import packing
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec
from compress.runtime import fused_experts, model_runner
from compress.runtime.fused_experts import FusedExperts

MOE = {"norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6}
TINY = {  # by dry_run: the engine's model (every layer sparse)
    False: Shape(256, 512, 2, 4, 2, model_type="qwen3_moe", extra=MOE | {"num_experts": 16, "num_experts_per_tok": 4,
                                                                          "moe_intermediate_size": 128}),
    True: Shape(64, 128, 2, 4, 2, model_type="qwen3_moe", extra=MOE | {"num_experts": 4, "num_experts_per_tok": 2,
                                                                       "moe_intermediate_size": 32}),
}
LAYER = {False: (SHAPES["qwen3-30b-a3b-8l"], 128, (1, 8, 64)),  # (shape, group, token counts) of the timed layer
         True: (Shape(64, 128, 1, 4, 2, model_type="qwen3_moe", extra=MOE | {"num_experts": 8, "num_experts_per_tok": 2,
                                                                              "moe_intermediate_size": 32}), 32, (1, 8))}
GREEDY = {False: (8, 32), True: (2, 4)}  # (prompts, tokens) of the greedy runs, by dry_run


def write_tiny(path, tokenizer_dir, dry_run: bool):
    """The tiny MoE checkpoint (bf16, random normal * 0.02 as random_checkpoint draws) with the given tokenizer."""
    return write_random_checkpoint(path, TINY[dry_run], tokenizer_dir=tokenizer_dir)


def emulate_cuda_on_cpu() -> None:
    """The dry run's engine as a CUDA one: Linears not swapped for the CPU kernels, MoE blocks fused (interpreter)."""
    fused_experts.DEVICES = fused_experts.DEVICES | {"cpu"}
    model_runner.choose = lambda model, config: None


def blocks(model: nn.Module) -> list[SparseMoe]:
    return [m for m in model.modules() if isinstance(m, SparseMoe)]


def both_paths(llm, run) -> tuple:
    """(run() with the engine's fused blocks, run() with every block on the per-expert path); the fused ones restored."""
    moes = blocks(llm.runner.model)
    saved = [b.fused for b in moes]
    if not any(isinstance(f, FusedExperts) for f in saved):
        raise RuntimeError(f"no MoE block of the engine was fused ({len(moes)} blocks): the fused path did not run")
    fused = run()
    try:
        for b in moes:
            b.fused = None
        return fused, run()
    finally:
        for b, f in zip(moes, saved):
            b.fused = f


def random_packed(fan_in: int, fan_out: int, spec: IntSpec, dtype, device, gen) -> PackedLinear:
    """A symmetric int4 PackedLinear of random codes and scales ~ 1 / (8 sqrt(fan_in)) (outputs of order one)."""
    m = PackedLinear(fan_in, fan_out, spec, False, dtype).to(device)
    m.weight_packed.copy_(packing.pack(torch.randint(0, 16, (fan_out, fan_in), generator=gen, device=device), 4))
    scale = torch.rand(fan_out, fan_in // spec.group_size, generator=gen, device=device) + 0.5
    m.weight_scale.copy_(scale / (8 * math.sqrt(fan_in)))
    return m


def layer_block(dry_run: bool, dtype: torch.dtype, device: torch.device) -> SparseMoe:
    """One MoE block of LAYER's shape on device: a random router, random int4 experts (built on meta first: the
    fp32 Linears a plain build would draw are 2.4 GB at Qwen3-30B-A3B's shape)."""
    shape, group, _ = LAYER[dry_run]
    cfg = ModelConfig.from_hf(hf_config(shape, dtype))
    with torch.device("meta"):
        block = SparseMoe(cfg, F.silu)
    gen = torch.Generator(device).manual_seed(0)
    block.gate = nn.Linear(cfg.hidden_size, cfg.moe.num_experts, bias=False, device=device, dtype=dtype)
    spec = IntSpec(4, group, symmetric=True)
    for expert in block.experts:
        for name in expert.names:
            meta = getattr(expert, name)
            setattr(expert, name, random_packed(meta.in_features, meta.out_features, spec, dtype, device, gen))
    return block.eval()


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


@torch.inference_mode()
def time_layer(dry_run: bool, device: torch.device, save) -> list[dict]:
    """Per token count: the block's forward fused and per expert (ms), and the fused routed sum against the reference
    within the kernel tests' bound (tests/kernels/tolerance.py)."""
    from tests.kernels.tolerance import RELATIVE

    dtype = torch.float32 if dry_run else torch.bfloat16
    block, (shape, group, counts) = layer_block(dry_run, dtype, device), LAYER[dry_run]
    fused, gen, rows = FusedExperts(block), torch.Generator(device).manual_seed(1), []
    layer = dict(experts=shape.extra["num_experts"], width=shape.extra["moe_intermediate_size"], hidden=shape.hidden,
                 top_k=shape.extra["num_experts_per_tok"], group=group, dtype=str(dtype).removeprefix("torch."))
    for tokens in counts:
        x = torch.randn(tokens, shape.hidden, generator=gen, device=device, dtype=dtype)  # [T, C]
        weights, ids = block.route(x)  # [T, K]
        err = relative(fused(x, weights, ids), reference.fused_moe_int4(x, fused.gate_up, fused.down, ids, weights.float()))
        block.fused = None
        loop_out, loop_ms = block(x), milliseconds(lambda: block(x))
        block.fused = fused
        fused_out, fused_ms = block(x), milliseconds(lambda: block(x))
        rows.append(dict(tokens=tokens, **layer, loop_ms=loop_ms, fused_ms=fused_ms, speedup=loop_ms / fused_ms,
                         err_vs_reference=err, bound=RELATIVE[dtype], match=err <= RELATIVE[dtype],
                         diff_vs_loop=relative(fused_out, loop_out)))
        save(dict(timing=rows))
    return rows


def markdown(result: dict) -> list[str]:
    """The phase's section of gpu_check.md (nothing when it did not run)."""
    out = []
    if result.get("greedy"):
        out += ["## Mixture of experts: greedy tokens, fused MoE kernel vs the per-expert path", "",
                f"{result['model']}, int4 RTN; {result['tokens']} tokens a prompt, each dtype's engine run both ways.", "",
                "| dtype | equal | near ties | first differing tokens |", "|---|---|---|---|"]
        for g in result["greedy"]:
            parted = [r["diverge_at"] for r in g["results"] if not r["equal"]]
            out.append(f"| {g['dtype']} | {g['equal']} of {g['prompts']} | {g['near_ties']} | {parted} |")
        out.append("")
    if result.get("timing"):
        r = result["timing"][0]
        out += [f"## Mixture of experts: one layer, fused kernel vs the per-expert loop ({r['experts']} experts of "
                f"{r['width']}, hidden {r['hidden']}, top {r['top_k']}, int4 g{r['group']}, {r['dtype']})", "",
                "The block's forward (router, top-k, routed experts) both ways; errors relative to the output's max: the "
                "fused routed sum against reference.fused_moe_int4, the fused block against the per-expert one.", "",
                "| tokens | per-expert ms | fused ms | speed-up | fused vs reference / bound | fused vs per-expert |",
                "|---|---|---|---|---|---|"]
        out += [f"| {r['tokens']} | {r['loop_ms']:.3f} | {r['fused_ms']:.3f} | {r['speedup']:.2f}x | {r['err_vs_reference']:.2g} / "
                f"{r['bound']:.2g}{'' if r['match'] else ' OFF'} | {r['diff_vs_loop']:.2g} |" for r in result["timing"]] + [""]
    return out


def phase(ctx, tokenizer: Path, greedy, compare, save) -> dict:
    """The moe phase (gpu_phases.Ctx ctx; gpu_phases' greedy and compare, passed in: that module imports this one):
    the tiny model's int4 greedy tokens fused vs per expert (bf16 and fp32; the dry run fp32), then time_layer."""
    from compress.cli import cli
    from compress.runtime.engine import LLM

    if ctx.dry_run:
        emulate_cuda_on_cpu()
    src = write_tiny(ctx.work / "moe-bf16", tokenizer, ctx.dry_run)
    cli.main(["quantize", str(src), "--method", "rtn", "--bits", "4", "-o", str(ctx.work / "moe-int4"), "--force"], standalone_mode=False)
    (n, tokens), rng, shape = GREEDY[ctx.dry_run], random.Random(1), TINY[ctx.dry_run]
    result = dict(model=f"qwen3_moe hidden {shape.hidden}, {shape.extra['num_experts']} experts of "
                  f"{shape.extra['moe_intermediate_size']}, top {shape.extra['num_experts_per_tok']}", tokens=tokens, greedy=[])
    for dtype in ("float32",) if ctx.dry_run else ("bfloat16", "float32"):
        llm = LLM(ctx.work / "moe-int4", dtype=dtype, enable_prefix_caching=False, kv_cache_memory=16 * 2**20)
        prompts = [[rng.randrange(3, llm.vocab_size) for _ in range(rng.randint(8, 32))] for _ in range(n)]
        results = [compare(a, b) for a, b in zip(*both_paths(llm, lambda: greedy(llm, prompts, tokens)))]
        result["greedy"].append(dict(dtype=dtype, prompts=len(prompts), equal=sum(r["equal"] for r in results),
                                     near_ties=sum(bool(r["near_tie"]) for r in results), results=results))
        save(result)
        del llm
    return result | dict(timing=time_layer(ctx.dry_run, torch.device(ctx.device), lambda rows: save(result | rows)))


def figures(result: dict) -> dict:
    """The phase's figures for gpu_check's targets: greedy runs parting not at a near tie, fused outputs off the
    reference, and the fused layer's speed-up over the per-expert loop at its worst token count."""
    out = {}  # from what was saved: a phase stopped at its limit keeps its finished dtypes and token counts
    if result.get("greedy"):
        out["moe_greedy_mismatches"] = sum(g["prompts"] - g["equal"] - g["near_ties"] for g in result["greedy"])
    if result.get("timing"):
        out["moe_kernel_mismatches"] = sum(not r["match"] for r in result["timing"])
        out["moe_fused_speedup_min"] = min(r["speedup"] for r in result["timing"])
    return out
