"""Activation-aware weight quantization searches (Lin et al., MLSys 2024). Returns numbers only.

Scale search: for Linears W sharing an input x, find per-input-channel scales
    s = mean|x|^alpha / sqrt(max(.) * min(.)),   alpha in {0, 1/grid, ..., (grid-1)/grid}
minimizing || f(x; Q(W * s) / s) - f(x; W) ||^2, where f is the sub-module whose output the
group feeds (attention, MLP, or the Linear itself). Salient channels (large mean|x|) get
scaled up before rounding, so their relative rounding error shrinks.

Clip search: per output channel and group, shrink the range to max|w| * (1 - i/grid) for
i < grid/2, keeping the ratio that minimizes the error of the group's partial dot products
with sampled inputs.

The module swap and the folding of scales into the model live in ``awq_apply.py``.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from compress.quant.primitives import IntSpec, grouped, pseudo_quantize


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


@torch.no_grad()
def search_clip(w: torch.Tensor, x: torch.Tensor, spec: IntSpec, grid: int = 20, max_shrink: float = 0.5, oc_batch: int = 256) -> torch.Tensor:
    """Best clipping threshold [O, G] for w [O, I] given sampled inputs x [K, I]."""
    xs = grouped(x, spec.group_size).permute(1, 0, 2)  # [G, K, g]
    best = []
    for wb in w.split(oc_batch):  # output channels in batches bound the memory
        wg = grouped(wb, spec.group_size)  # [o, G, g]
        ref = torch.einsum("ogc,gkc->ogk", wg, xs)  # [o, G, K] per-group partial outputs
        org_max = wg.abs().amax(-1)  # [o, G]
        best_err = torch.full_like(org_max, float("inf"))
        best_max = org_max.clone()
        for i in range(int(max_shrink * grid)):
            max_val = org_max * (1 - i / grid)
            q = grouped(pseudo_quantize(wb, spec, max_val), spec.group_size)
            err = (torch.einsum("ogc,gkc->ogk", q, xs) - ref).float().pow(2).mean(-1)  # [o, G]
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_max = torch.where(better, max_val, best_max)
        best.append(best_max)
    return torch.cat(best)
