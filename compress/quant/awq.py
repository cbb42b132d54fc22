"""Activation-aware weight quantization searches (Lin et al., MLSys 2024). Returns numbers only.

Scale search: for Linears W sharing an input x, find per-input-channel scales
    s = mean|x|^alpha / sqrt(max(.) * min(.)),   alpha in {0, 1/grid, ..., (grid-1)/grid}
minimizing || f(x; Q(W * s) / s) - f(x; W) ||^2, where f is the sub-module whose output the
group feeds (attention, MLP, or the Linear itself). Salient channels (large mean|x|) get
scaled up before rounding, so their relative rounding error shrinks.

Range search (AWQ's clip search, extended): per output channel and group, shrink the top and the
bottom of the range independently to max * (1 - i/grid) and min * (1 - j/grid) for i, j < grid/2
(symmetric: one shared shrink), refit the scale of the rounded codes by least squares, and keep the
candidate that minimizes the error of the group's partial dot products with the calibration
inputs, e^T H e with H = E[x x^T] over the group's input columns. With H built once, the search's
cost does not grow with the number of input tokens, so it uses all the recorded ones.

The module swap and the folding of scales into the model live in ``awq_apply.py``.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from compress.quant.primitives import IntSpec, grouped, pseudo_quantize, qparams, quantize, range_qparams


@dataclass
class ScaleResult:
    scales: torch.Tensor  # [C] per input channel of the group's Linears (before expansion)
    alpha: float
    loss: float
    loss_unscaled: float  # alpha = 0, i.e. plain rounding


def candidate_scales(mean_abs: torch.Tensor, grid: int) -> torch.Tensor:
    """[grid, C] scales, one row per alpha = k / grid."""
    alphas = torch.arange(grid, dtype=torch.float32, device=mean_abs.device)[:, None] / grid
    s = mean_abs.float().clamp(min=1e-4)[None, :].pow(alphas)  # [grid, C]
    return s / (s.amax(1, keepdim=True) * s.amin(1, keepdim=True)).sqrt()


@torch.no_grad()
def search_scale(
    module: nn.Module,
    weights: dict[str, torch.Tensor],  # relative name of each Linear's weight in module -> [O, C']
    x: torch.Tensor,  # the module's input
    mean_abs: torch.Tensor,  # [C] mean |input| of the Linears, in the search space
    expand: Callable[[torch.Tensor], torch.Tensor],  # [C] -> [C'] scales on the Linears' columns
    spec: IntSpec,
    grid: int,
) -> ScaleResult:
    target = module(x)
    losses = []
    cands = candidate_scales(mean_abs, grid)
    for s in cands:
        se = expand(s).to(x.dtype)  # [C']
        params = {name: pseudo_quantize(w * se, spec) / se for name, w in weights.items()}
        out = functional_call(module, params, (x,))
        losses.append((out - target).float().pow(2).mean().item())
    best = min(range(grid), key=losses.__getitem__)
    return ScaleResult(cands[best], best / grid, losses[best], losses[0])


def group_hessians(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[G, g, g]: E[x_c x_d] over the rows of x [K, I], per group of input columns."""
    xs = grouped(x.float(), group_size).permute(1, 0, 2)  # [G, K, g]
    return xs.transpose(1, 2) @ xs / xs.shape[1]


def weighted_error(e: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """[o, G]: e^T H e per group, for weight errors e [o, G, g] and group Hessians h [G, g, g]."""
    eh = torch.bmm(e.transpose(0, 1), h).transpose(0, 1)  # [o, G, g]
    return (eh * e).sum(-1)


def refit_scale(wg: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """[o, G]: per group, the s minimizing (codes s - w)^T H (codes s - w) for fixed codes = q - z [o, G, g],
    i.e. s = codes^T H w / codes^T H codes; ``scale`` where that is not a positive number."""
    ch = torch.bmm(codes.transpose(0, 1), h).transpose(0, 1)  # [o, G, g]
    num, den = (ch * wg).sum(-1), (ch * codes).sum(-1)
    fit = num / den.clamp(min=1e-30)
    return torch.where((den > 0) & (fit > 0), fit, scale)


def centered_codes(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: IntSpec) -> torch.Tensor:
    """[o, G, g] float q - z: the rounded weights w [o, I] in units of their group's scale."""
    q = grouped(quantize(w, scale, zero, spec), spec.group_size).float()
    return q - zero[..., None].float()


def grid_error(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: IntSpec, h: torch.Tensor) -> torch.Tensor:
    """[o, G]: e^T H e of rounding w [o, I] (fp32) to the grid (scale, zero) [o, G]."""
    return weighted_error(centered_codes(w, scale, zero, spec) * scale[..., None] - grouped(w, spec.group_size), h)


@torch.no_grad()
def search_qparams(w: torch.Tensor, h: torch.Tensor, spec: IntSpec, grid: int = 20, max_shrink: float = 0.5,
                   oc_batch: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [O, G] for w [O, I] given its inputs' group Hessians h [G, g, g]
    (``group_hessians``). Per group, e^T H e is never above plain rounding's, for the fp32 scale
    (the stored one is rounded to the weight's dtype)."""
    h = h.float()
    shrinks = [1 - i / grid for i in range(max(1, int(max_shrink * grid)))]
    pairs = [(a, a) for a in shrinks] if spec.symmetric else [(a, b) for a in shrinks for b in shrinks]
    scales, zeros = [], []
    for wb in w.float().split(oc_batch):  # output channels in batches bound the memory
        wg = grouped(wb, spec.group_size)  # [o, G, g]
        hi, lo = wg.amax(-1), wg.amin(-1)
        best_s, best_z = qparams(wb, spec)
        best_err = grid_error(wb, best_s, best_z, spec, h)
        for a, b in pairs:
            s, z = range_qparams(hi * a, lo * b, spec)
            s = refit_scale(wg, centered_codes(wb, s, z, spec), s, h)
            err = grid_error(wb, s, z, spec, h)  # re-rounded to the refit scale: what is stored
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_s, best_z = torch.where(better, s, best_s), torch.where(better, z, best_z)
        scales.append(best_s)
        zeros.append(best_z)
    return torch.cat(scales), torch.cat(zeros)
