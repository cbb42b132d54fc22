"""Block-output tuning of the rounding (AutoRound's signed gradient descent, Cheng et al. 2023), started from AWQ's
searched grids and GPTQ's codes.

AWQ's searches and GPTQ each minimize the error of one sub-module or one Linear; none sees the whole block's output,
nor the error that the blocks before left in its input. Here each quantized Linear of a block gets a rounding offset
per weight (in [-1/2, 1/2], added before rounding, on top of the codes it already has), moved by lr * sign(gradient)
of || block_q(x_q) - block(x) ||^2: x_q are the inputs the quantized blocks before give, block(x) the unquantized
model's output there (AutoRound's objective; the rounding's gradient passes straight through). lr = 1/iters, decayed
linearly to 0; the iterate with the lowest loss on its batch is kept.

The grids stay the searched ones. AutoRound also tunes each group's range; here a factor per group's scale, tuned
the same way, lowered the loss on the rows it was tuned on and raised it on held-out rows (SmolLM2's blocks 1-3,
2026-12-04), while the offsets alone lowered both (held-out by 6-11 %).
"""

from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call
from tqdm import tqdm

from compress.quant.primitives import IntSpec, grouped, qparams, quantize

BATCH = 8  # calibration rows per step (AutoRound's default)
RANGE = 0.5  # |offset| stays within this: a code moves at most one step from nearest rounding's (plus GPTQ's move)


def round_ste(u: torch.Tensor) -> torch.Tensor:
    """round(u) whose gradient is the identity's."""
    return u + (torch.round(u) - u).detach()


@dataclass
class Rounding:
    """One Linear's codes as a function of offset [O, I]: clamp(round(w / s + offset) + base, 0, qmax) with
    base = codes - round(w / s), so that a zero offset gives back the codes it started from."""

    w: torch.Tensor  # [O, G, g] fp32, divided by its group's scale
    scale: torch.Tensor  # [O, G] as given
    zero: torch.Tensor  # [O, G] int32 as given
    base: torch.Tensor  # [O, G, g] fp32 (integers)
    qmax: int

    @classmethod
    def start(cls, w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, codes: torch.Tensor, spec: IntSpec) -> "Rounding":
        scale = scale.detach()  # a scale computed with autograd on would tie every step to one graph
        u = grouped(w.float(), spec.group_size) / scale.float()[..., None]  # [O, G, g]
        return cls(u, scale, zero, grouped(codes.float(), spec.group_size) - torch.round(u), spec.qmax)

    def codes(self, offset: torch.Tensor, ste: bool = False) -> torch.Tensor:
        """[O, G, g] codes (fp32)."""
        u = self.w + offset.view_as(self.w)
        return ((round_ste(u) if ste else torch.round(u)) + self.base).clamp(0, self.qmax)

    def weight(self, offset: torch.Tensor) -> torch.Tensor:
        """[O, I] dequantized weight, differentiable in offset."""
        return ((self.codes(offset, ste=True) - self.zero[..., None]) * self.scale.float()[..., None]).flatten(1)


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
            seed: int) -> dict[str, torch.Tensor]:
    """The offsets [O, I] of each Linear of ``start`` at the step whose batch loss was lowest."""
    offsets = {name: torch.zeros(r.w.flatten(1).shape, device=r.w.device, requires_grad=True) for name, r in start.items()}
    best, kept, first = float("inf"), {name: t.detach().clone() for name, t in offsets.items()}, None
    bar = tqdm(batches(x.shape[0], iters, seed), desc="tune", unit="step", leave=False)
    for step, idx in enumerate(bar):
        with torch.enable_grad():
            swapped = {f"{name}.weight": r.weight(offsets[name]).to(x.dtype) for name, r in start.items()}
            loss = torch.nn.functional.mse_loss(functional_call(block, swapped, (x[idx],)), target[idx])  # x [B, T, C]
            loss.backward()
        with torch.no_grad():
            first = loss.item() if first is None else first
            if loss.item() < best:
                best, kept = loss.item(), {name: t.detach().clone() for name, t in offsets.items()}
                bar.set_postfix(best=f"{best:.3g}", first=f"{first:.3g}")
            lr = (1 - step / iters) / iters
            for t in offsets.values():
                t.sub_(lr * t.grad.sign()).clamp_(-RANGE, RANGE)
                t.grad = None
    return kept


def tune_block(block: nn.Module, x: torch.Tensor, target: torch.Tensor, params: dict, codes: dict, spec: IntSpec,
               iters: int, seed: int) -> tuple[dict, dict]:
    """(params, codes) of every Linear of ``block.linears`` after ``iters`` steps; x, target [N, T, C]. A Linear
    missing from ``params`` is on its range's grid, one missing from ``codes`` starts from nearest rounding. The
    codes come back as uint8 [O, I]."""
    weights = {name: block.get_submodule(name).weight.detach() for name in block.linears}
    params = {name: params.get(name) or qparams(w, spec) for name, w in weights.items()}
    start = {name: Rounding.start(w, *params[name], codes[name] if name in codes else quantize(w, *params[name], spec), spec)
             for name, w in weights.items()}
    with frozen(block):
        kept = descend(block, start, x, target, iters, seed)
    return params, {name: r.codes(kept[name]).to(torch.uint8).flatten(1) for name, r in start.items()}
