"""Block-output tuning of the rounding (AutoRound's signed gradient descent, Cheng et al. 2023), started from AWQ's
searched grids and GPTQ's codes.

AWQ's searches and GPTQ each minimize the error of one sub-module or one Linear; none sees the whole block's output,
nor the error that the blocks before left in its input. Here each quantized Linear of a block gets a rounding offset
per weight (in [-1/2, 1/2], added before rounding, on top of the codes it already has), moved by lr * sign(gradient)
of || block_q(x_q) - block(x) ||^2: x_q are the inputs the quantized blocks before give, block(x) the unquantized
model's output there (AutoRound's objective; the rounding's gradient passes straight through). lr = 1/iters, decayed
linearly to 0; the iterate with the lowest loss on its batch is kept.

Straight through, d loss / d offset = d loss / d W * scale where the code is inside [0, qmax] (0 where the clamp
holds it), and scales are positive: the step's sign is the weight gradient's sign there. So each step builds the
dequantized weights without autograd and differentiates the block in them alone, which keeps no graph over the
44 M weights of a 1.1B block. The block runs under bf16 autocast where the hardware multiplies bf16 natively
(AutoRound's default too): 1.6x faster a step on an AVX512-BF16 CPU, block-output error within run-to-run noise
of fp32's at 200 steps (docs/awq.md).

The grids stay the searched ones. AutoRound also tunes each group's range; here a factor per group's scale, tuned
the same way, lowered the loss on the rows it was tuned on and raised it on held-out rows (SmolLM2's blocks 1-3,
2026-12-04), while the offsets alone lowered both (held-out by 6-11 %).

The GGUF export tunes its codes the same way inside each llama.cpp type's blocks, on the grids the type stores
(compress/gguf/rounding.py): ``tune_codes`` takes any grid w = q a + b.
"""

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from compress import host
from compress.quant.primitives import IntSpec, grouped, nonzero, qparams, quantize

BATCH = 8  # calibration rows per step (AutoRound's default)
RANGE = 0.5  # |offset| stays within this: a code moves at most one step from nearest rounding's (plus GPTQ's move)


@dataclass
class Rounding:
    """One Linear's codes as a function of offset [O, I]: clamp(round(u + offset) + base, 0, qmax), where u = (w - b) / a
    is each weight in steps of its group's grid w = q a + b (a >= 0) and base = codes - round(u), so that a zero offset
    gives back the codes it started from. Our int grids are w = (q - z) s (``on_int_grid``); a GGUF type's (q a + b
    with any b, compress/gguf/rounding.py) are taken as they are."""

    w: torch.Tensor  # [O, G, g] fp32: u
    a: torch.Tensor  # [O, G] fp32
    b: torch.Tensor  # [O, G] fp32
    base: torch.Tensor  # [O, G, g] fp32 (integers)
    qmax: int

    @classmethod
    def start(cls, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor, codes: torch.Tensor, qmax: int) -> "Rounding":
        """w, codes [O, I]; a, b [O, G]: the groups are I / G wide. Where a = 0 every code gives b."""
        g = w.shape[1] // a.shape[1]
        a, b = a.float(), b.float()
        u = (grouped(w.float(), g) - b[..., None]) / nonzero(a)[..., None]  # [O, G, g]
        return cls(u, a, b, grouped(codes.float(), g) - torch.round(u), qmax)

    @classmethod
    def on_int_grid(cls, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, codes: torch.Tensor,
                    spec: IntSpec) -> "Rounding":
        a = scale.float()
        return cls.start(w, a, -zero.float() * a, codes, spec.qmax)

    def unclamped(self, offset: torch.Tensor) -> torch.Tensor:
        """[O, G, g] codes before the clamp (fp32)."""
        return torch.round(self.w + offset.view_as(self.w)).add_(self.base)

    def codes(self, offset: torch.Tensor) -> torch.Tensor:
        """[O, G, g] codes (fp32)."""
        return self.unclamped(offset).clamp_(0, self.qmax)

    @torch.no_grad()
    def weight(self, offset: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """([O, I] dequantized weight, [O, I] bool: where a step moves the offset, the code not held by the clamp)."""
        q = self.unclamped(offset)
        moves = ((q >= 0) & (q <= self.qmax)).flatten(1)
        return q.clamp_(0, self.qmax).mul_(self.a[..., None]).add_(self.b[..., None]).flatten(1), moves


def step_dtype(device: torch.device, name: str | None) -> torch.dtype:
    """The dtype of the steps' matmuls: ``name``, or (None) bfloat16 where the device multiplies it natively (a
    CUDA GPU that supports it; a CPU with AVX512-BF16 or AMX-BF16), float32 elsewhere."""
    if name is not None:
        return getattr(torch, name)
    if device.type == "cuda":
        native = torch.cuda.is_bf16_supported()
    else:
        native = bool(host.cpu_flags() & {"avx512_bf16", "amx_bf16"})
    return torch.bfloat16 if native else torch.float32


def batches(n: int, iters: int, seed: int) -> list[torch.Tensor]:
    """Row indices of each step: seeded permutations of the n rows, cut into batches of min(BATCH, n)."""
    gen, size, out = torch.Generator().manual_seed(seed), min(BATCH, n), []
    while len(out) < iters:
        perm = torch.randperm(n, generator=gen)
        out += [perm[i : i + size] for i in range(0, n - size + 1, size)]
    return out[:iters]


@contextmanager
def frozen(block: nn.Module):
    """The block's own parameters out of autograd: the steps differentiate the offsets only."""
    trained = [p for p in block.parameters() if p.requires_grad]
    for p in trained:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trained:
            p.requires_grad_(True)


def descend(block: nn.Module, start: dict[str, Rounding], x: torch.Tensor, target: torch.Tensor, iters: int,
            seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """The offsets [O, I] of each Linear of ``start`` at the step whose batch loss was lowest; the block's matmuls
    in ``dtype`` (autocast), the loss in fp32."""
    offsets = {name: torch.zeros(r.w.flatten(1).shape, device=r.w.device) for name, r in start.items()}
    best, kept, first = float("inf"), {name: t.clone() for name, t in offsets.items()}, None
    amp = torch.autocast(x.device.type, dtype=dtype, enabled=dtype != torch.float32)
    bar = tqdm(batches(x.shape[0], iters, seed), desc="tune", unit="step", leave=False)
    for step, idx in enumerate(bar):
        built = {name: r.weight(offsets[name]) for name, r in start.items()}
        swapped = {f"{name}.weight": w.to(x.dtype).requires_grad_(True) for name, (w, _) in built.items()}
        with torch.enable_grad():
            with amp:
                out = functional_call(block, swapped, (x[idx],))  # x [B, T, C]
            loss = torch.nn.functional.mse_loss(out.float(), target[idx].float())
            loss.backward()
        with torch.no_grad():
            first = loss.item() if first is None else first
            if loss.item() < best:
                best, kept = loss.item(), {name: t.clone() for name, t in offsets.items()}
                bar.set_postfix(best=f"{best:.3g}", first=f"{first:.3g}")
            lr = (1 - step / iters) / iters
            for name, t in offsets.items():
                w = swapped[f"{name}.weight"]
                t.sub_(w.grad.sign().mul_(built[name][1]), alpha=lr).clamp_(-RANGE, RANGE)
    return kept


def tune_codes(block: nn.Module, x: torch.Tensor, target: torch.Tensor, start: dict[str, Rounding], iters: int, seed: int,
               dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    """uint8 codes [O, I] of each Linear of ``start`` (name -> its Rounding) after ``iters`` steps in ``dtype``;
    x, target [N, T, C]."""
    with frozen(block):
        kept = descend(block, start, x, target, iters, seed, dtype)
    return {name: r.codes(kept[name]).to(torch.uint8).flatten(1) for name, r in start.items()}


def tune_block(block: nn.Module, x: torch.Tensor, target: torch.Tensor, params: dict, codes: dict, spec: IntSpec,
               iters: int, seed: int, dtype: torch.dtype = torch.float32) -> tuple[dict, dict]:
    """(params, codes) of every Linear of ``block.linears`` after ``iters`` steps in ``dtype``; x, target [N, T, C].
    A Linear missing from ``params`` is on its range's grid, one missing from ``codes`` starts from nearest
    rounding. The codes come back as uint8 [O, I]."""
    weights = {name: block.get_submodule(name).weight.detach() for name in block.linears}
    params = {name: params.get(name) or qparams(w, spec) for name, w in weights.items()}
    start = {name: Rounding.on_int_grid(w, *params[name], codes[name] if name in codes else quantize(w, *params[name], spec), spec)
             for name, w in weights.items()}
    return params, tune_codes(block, x, target, start, iters, seed, dtype)
