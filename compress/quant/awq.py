"""Activation-aware weight quantization searches (Lin et al., MLSys 2024). Returns numbers only.

Scale search: for Linears W sharing an input x, find per-input-channel scales
    s = mean|x|^alpha / sqrt(max(.) * min(.)),   alpha in {0, 1/grid, ..., (grid-1)/grid}
minimizing || f(x; Q(W * s) / s) - f(x; W) ||^2, where f is the sub-module whose output the
group feeds (attention, MLP, or the Linear itself). Salient channels (large mean|x|) get
scaled up before rounding, so their relative rounding error shrinks. Each candidate's weights are
rounded by blocks of rows that stay in cache (``scaled_round_trip``; on CPU in one C pass per block), with
the numbers of the plain expression: the full-size temporaries made this search as slow as the range search.

Range search (AWQ's clip search, extended): per output channel and group, shrink the top and the
bottom of the range independently to max * (1 - i/grid) and min * (1 - j/grid) for i, j < grid/2
(symmetric: one shared shrink), refit the scale of the rounded codes by least squares, and keep the
candidate that minimizes the error of the group's partial dot products with the calibration
inputs, e^T H e with H = E[x x^T] over the group's input columns. With H built once, the search's
cost does not grow with the number of input tokens, so it uses all the recorded ones. It grows with
the candidates instead (two g x g matmuls per candidate and weight), yet every pair is tried: a
coarse-to-fine search (41 grids instead of 101, within 1% of this one's e^T H e) cost SmolLM2 1.0
perplexity point at int3 and 0.13 at int4 (WikiText-2, 20 windows).

How it is computed: every candidate costs two [o, g] x [g, g] products and, in torch, ~16 elementwise passes
over the tile, about half the time each. On CPU the search runs in a C kernel (``range_search_cpu``) that
keeps a few rows in registers and L1 and rounds every step as torch and MKL do (the products as chains of
FMAs, the sums in ATen's order), so it returns the torch path's grids bit for bit (checked on a test tile at
first use; the torch path runs where the kernel is not built or disagrees). Tiles of rows run side by side,
one thread each (``side_by_side``): the result does not depend on the thread count. Tried and dropped
(2026-12, 1.1B shape and SmolLM2 Linears): screening candidates with bf16 products and re-scoring the best
few in fp32 (no faster, the casts cost what bf16 saved, and e^T H e cancels so much with correlated inputs
that bf16 H put it off by up to 2x); ranking by the refit's error before re-rounding (codes change on
re-rounding in 95% of rows; the best of its top 16 missed o_proj's best grid by 8-10% of e^T H e); feeding
several candidates through each torch op (the ops are bound by bandwidth and the products, not dispatch);
carrying H c from one candidate to the next in fp64 (about 45 codes change per candidate at int4, g128,
each adding a row of H), with H c in registers: 1.1-1.3x slower than the two products, as each changed
code reads a 1 KiB row of H from L2.

The module swap and the folding of scales into the model live in ``awq_apply.py``.
"""

import functools
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from compress.kernels import range_search_cpu, round_trip_cpu
from compress.quant.primitives import IntSpec, grouped, range_qparams


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
    # One buffer per weight for every alpha: a new one each time cost a page fault per 4 KiB (~1 s a 1.1B block).
    bufs = {name: torch.empty(w.shape, dtype=torch.result_type(w, x), device=w.device) for name, w in weights.items()}
    for s in cands:
        se = expand(s).to(x.dtype)  # [C']
        params = {name: scaled_round_trip(w, se, spec, bufs[name]) for name, w in weights.items()}
        out = functional_call(module, params, (x,))
        losses.append((out - target).float().pow(2).mean().item())
    best = min(range(grid), key=losses.__getitem__)
    return ScaleResult(cands[best], best / grid, losses[best], losses[0])


ROUND_TRIP_ELEMENTS = 2**18  # weights per block of rows in scaled_round_trip: its temporaries stay in a core's L2


def scaled_round_trip(w: torch.Tensor, se: torch.Tensor, spec: IntSpec, out: torch.Tensor | None = None) -> torch.Tensor:
    """pseudo_quantize(w * se, spec) / se for w [O, I] and input channel scales se [I], bit for bit, by blocks of
    rows: the expression's full-size temporaries (a dozen passes over [O, I] in DRAM) made the scale search ~5x
    slower. Rounding, clamping and (q - z) s are done in place; the integer round trip through uint8 is exact.
    fp32 on CPU: one C pass per block (``round_trip_cpu``), 3-4x faster than the dozen torch ops, same bits."""
    if out is None:
        out = torch.empty(w.shape, dtype=torch.result_type(w, se), device=w.device)  # [O, I]
    fused = round_trip_cpu.supports(w, se, spec.group_size) and out.dtype == torch.float32

    def block(r: slice) -> None:
        if fused:
            return round_trip_cpu.round_trip(w[r], se, out[r], spec.bits, spec.group_size, spec.symmetric)
        ws = w[r] * se  # [r, I]
        g = grouped(ws.float(), spec.group_size)  # [r, G, g]
        scale, zero = range_qparams(g.amax(-1), g.amin(-1), spec)  # [r, G]
        scale, zero = scale[..., None], zero[..., None]
        q = g.div_(scale).round_().add_(zero).clamp_(0, spec.qmax).sub_(zero)  # q - z
        torch.div(q.mul_(scale).view(ws.shape).to(ws.dtype), se, out=out[r])

    rows = max(1, ROUND_TRIP_ELEMENTS // w.shape[1])
    side_by_side(block, [slice(r0, r0 + rows) for r0 in range(0, w.shape[0], rows)], w.device)
    return out


def group_hessians(x: torch.Tensor, group_size: int) -> torch.Tensor:
    """[G, g, g]: E[x_c x_d] over the rows of x [K, I], per group of input columns."""
    xs = grouped(x.float(), group_size).permute(1, 0, 2)  # [G, K, g]
    return xs.transpose(1, 2) @ xs / xs.shape[1]


def weighted_error(e: torch.Tensor, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """[G, o]: e^T H e per group, for weight errors e [G, o, g] and group Hessians h [G, g, g]; ``out`` [G, o, g]: scratch."""
    he = torch.bmm(e, h, out=out)  # [G, o, g]
    return he.mul_(e).sum(-1)


def refit_scale(wg: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, h: torch.Tensor,
                scratch: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)) -> torch.Tensor:
    """[G, o]: per group, the s minimizing (codes s - w)^T H (codes s - w) for fixed codes = q - z [G, o, g],
    i.e. s = codes^T H w / codes^T H codes; ``scale`` [G, o] where that is not a positive number."""
    hc = torch.bmm(codes, h, out=scratch[0])  # [G, o, g]
    den = torch.mul(hc, codes, out=scratch[1]).sum(-1)
    num = hc.mul_(wg).sum(-1)
    fit = num / den.clamp(min=1e-30)
    return torch.where((den > 0) & (fit > 0), fit, scale)


def code_bounds(zero: torch.Tensor, spec: IntSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """(-z, qmax - z) [..., 1] for zero points z [...] (fp32 integers): the range of q - z."""
    return -zero[..., None], spec.qmax - zero[..., None]


def round_to_grid(wg: torch.Tensor, scale: torch.Tensor, bounds: tuple[torch.Tensor, torch.Tensor],
                  out: torch.Tensor) -> torch.Tensor:
    """``out`` [G, o, g] <- q - z: the weights wg [G, o, g] rounded to the grids of scale [G, o] (fp32) and zero
    point z, in units of scale; ``bounds`` = ``code_bounds(z)``."""
    torch.div(wg, scale[..., None], out=out).round_()
    return torch.minimum(torch.maximum(out, bounds[0], out=out), bounds[1], out=out)


def grid_error(wg: torch.Tensor, scale: torch.Tensor, bounds: tuple[torch.Tensor, torch.Tensor], h: torch.Tensor,
               scratch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """[G, o]: e^T H e of rounding wg [G, o, g] to the grids (scale [G, o], ``code_bounds``); scratch: two [G, o, g]."""
    e = round_to_grid(wg, scale, bounds, scratch[0]).mul_(scale[..., None]).sub_(wg)  # [G, o, g]
    return weighted_error(e, h, scratch[1])


def shrink_pairs(grid: int, max_shrink: float, symmetric: bool) -> torch.Tensor:
    """[P, 2] (top, bottom) range factors 1 - i / grid for i < max_shrink * grid, rounded once to fp32: every pair,
    or (a, a) for symmetric grids."""
    factors = (1 - torch.arange(max(1, int(max_shrink * grid)), dtype=torch.float64) / grid).float()
    return torch.stack([factors, factors], 1) if symmetric else torch.cartesian_prod(factors, factors)


def try_shrinks(wg: torch.Tensor, h: torch.Tensor, spec: IntSpec, factors: torch.Tensor,
                scratch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Refit scales, zero points (fp32 integers) and their e^T H e, each [P, G, o], for the rows wg [G, o, g] on the
    grids spanning [min * bottom, max * top] of each group; factors [P, 2] are (top, bottom)."""
    codes, hc, prod = scratch  # [G, o, g]
    top, bottom = factors[:, 0, None, None], factors[:, 1, None, None]  # [P, 1, 1]
    scales, zeros = range_qparams(wg.amax(-1) * top, wg.amin(-1) * bottom, spec)  # [P, G, o]
    zeros, errs = zeros.float(), torch.empty_like(scales)
    lows, highs = code_bounds(zeros, spec)  # [P, G, o, 1]
    for p, s in enumerate(scales):
        bounds = lows[p], highs[p]
        s.copy_(refit_scale(wg, round_to_grid(wg, s, bounds, codes), s, h, (hc, prod)))
        errs[p] = grid_error(wg, s, bounds, h, (codes, hc))  # re-rounded to the refit scale: what is stored
    return scales, zeros, errs


def search_tile(wg: torch.Tensor, h: torch.Tensor, spec: IntSpec, factors: torch.Tensor,
                fused: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Best (scale, zero) [G, o] for the rows wg [G, o, g]: the first of the least e^T H e among plain rounding and
    the shrinks ``factors`` [P, 2]. ``fused``: through the C kernel (``fused_search``), with the same numbers."""
    if fused:
        return search_tile_fused(wg, h, spec, factors)
    scratch = tuple(torch.empty_like(wg) for _ in range(3))  # [G, o, g]
    s0, z0 = range_qparams(wg.amax(-1), wg.amin(-1), spec)  # [G, o]: plain rounding, no refit
    z0 = z0.float()
    e0 = grid_error(wg, s0, code_bounds(z0, spec), h, scratch[:2])
    scales, zeros, errs = try_shrinks(wg, h, spec, factors, scratch)  # [P, G, o]
    best = torch.cat([e0[None], errs]).argmin(0, keepdim=True)  # [1, G, o]
    return torch.cat([s0[None], scales]).gather(0, best)[0], torch.cat([z0[None], zeros]).gather(0, best)[0]


def search_tile_fused(wg: torch.Tensor, h: torch.Tensor, spec: IntSpec,
                      factors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``search_tile`` in ``range_search_cpu``, a group at a time: each candidate's ~16 passes over the tile and its
    two matrix products become one loop over a few rows in registers and L1."""
    s0, z0 = range_qparams(wg.amax(-1), wg.amin(-1), spec)  # [G, o]
    top, bottom = factors[:, 0, None, None], factors[:, 1, None, None]  # [P, 1, 1]
    scales, zeros = range_qparams(wg.amax(-1) * top, wg.amin(-1) * bottom, spec)  # [P, G, o]
    found = [range_search_cpu.search_rows(wg[i], h[i], spec.qmax, (s0[i], z0[i].float()), (scales[:, i], zeros[:, i].float()))
             for i in range(wg.shape[0])]
    return torch.stack([s for s, _ in found]), torch.stack([z for _, z in found])  # [G, o]


def fused_search(wg: torch.Tensor, spec: IntSpec) -> bool:
    """Whether ``search_tile`` may take the C kernel for rows like wg [G, o, g]: it is built, takes g, and gave
    the torch path's numbers bit for bit on a test tile (its sums and products copy torch's and MKL's order, which
    a build or a CPU could change: then the torch path runs)."""
    return range_search_cpu.supports(wg) and fused_agrees(wg.shape[-1], spec)


@functools.cache
def fused_agrees(g: int, spec: IntSpec) -> bool:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(1, 64, g, generator=gen) * 0.02
    w[..., :: max(1, g // 5)] *= 8  # a few large weights, so that shrinking the range pays
    x = torch.randn(512, g, generator=gen) + torch.randn(512, 4, generator=gen) @ torch.randn(4, g, generator=gen)
    h, factors = group_hessians(x, g), shrink_pairs(20, 0.5, spec.symmetric)
    fused, plain = search_tile_fused(w, h, spec, factors), search_tile(w, h, spec, factors)
    return all(torch.equal(a, b) for a, b in zip(fused, plain))


def side_by_side(fn: Callable, items: Iterable, device: torch.device) -> None:
    """fn(item) for every item; on CPU, one worker thread per intra-op thread, each running its ops on one thread.
    The tiles' ops are small (~10-150 us): split over 2 threads inside each op they ran 1.7x faster than on one,
    and lost much more whenever another process held a core. Whole tiles side by side scale better (the GIL is
    released while an op runs), and each op computes the same numbers on one thread as on several."""
    threads = torch.get_num_threads()
    if device.type != "cpu" or threads == 1:
        for item in items:
            fn(item)
        return
    grad = torch.is_grad_enabled()  # thread-local: the workers start with the default

    def run(item):
        with torch.set_grad_enabled(grad):
            fn(item)

    torch.set_num_threads(1)  # process-wide: the workers' ops run on their own thread
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(run, items))  # list: re-raises a worker's exception
    finally:
        torch.set_num_threads(threads)


def tile_weights(device: torch.device, total: int) -> int:
    """Weights per search tile, of ``total``: on CPU about what a core's L2 cache holds next to the scratch space,
    or less so that each worker gets a few tiles; elsewhere enough to keep the kernels busy, with the memory still
    bounded."""
    if device.type != "cpu":
        return 2**24
    return min(2**17, max(2**14, total // (4 * torch.get_num_threads())))


class GridSearch:
    """``search_qparams`` in tiles that can run among other jobs: ``search(tile)`` for every tile of ``tiles``
    (side by side, in any order), then ``result()``."""

    def __init__(self, w: torch.Tensor, h: torch.Tensor, spec: IntSpec, grid: int = 20, max_shrink: float = 0.5):
        self.h, self.wg = h.float(), grouped(w.float(), spec.group_size).transpose(0, 1)  # [G, g, g], [G, O, g]
        self.spec, self.factors = spec, shrink_pairs(grid, max_shrink, spec.symmetric).to(w.device)  # [P, 2]
        n_groups, n_rows, g = self.wg.shape
        budget = tile_weights(w.device, self.wg.numel())
        rows = min(n_rows, max(1, budget // g))  # tiles of whole groups over some output channels
        groups = max(1, budget // (rows * g))
        self.tiles = [(slice(g0, g0 + groups), slice(r0, r0 + rows)) for g0 in range(0, n_groups, groups) for r0 in range(0, n_rows, rows)]
        self.scale, self.zero = torch.empty(n_groups, n_rows, device=w.device), torch.empty(n_groups, n_rows, device=w.device)
        self.fused = fused_search(self.wg, spec)

    @torch.no_grad()
    def search(self, tile: tuple[slice, slice]) -> None:
        self.scale[tile], self.zero[tile] = search_tile(self.wg[tile].contiguous(), self.h[tile[0]], self.spec, self.factors, self.fused)

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Scales and zero points [O, G] (fp32, int32)."""
        return self.scale.T.contiguous(), self.zero.T.to(torch.int32).contiguous()


@torch.no_grad()
def search_qparams(w: torch.Tensor, h: torch.Tensor, spec: IntSpec, grid: int = 20,
                   max_shrink: float = 0.5) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [O, G] (fp32, int32) for w [O, I] given its inputs' group Hessians h [G, g, g]
    (``group_hessians``). Per group, e^T H e is never above plain rounding's, for the fp32 scale
    (the stored one is rounded to the weight's dtype)."""
    search = GridSearch(w, h, spec, grid, max_shrink)
    side_by_side(search.search, search.tiles, w.device)
    return search.result()
