"""Our weight-only grid search for the GGUF block types (gguf_blocks.py): per group of a row, the step and offset
with the least (importance-weighted) squared error among llama.cpp's candidate ranges and more, each refined by
least squares, then fitted to what the type stores. Imports only torch.
"""

import torch

from compress.quant.gguf_blocks import BlockType, Grid, check_width, grid_of, grouped, stored_numbers, upward
from compress.quant.primitives import nonzero

CHUNK = 2**17  # weights searched at a time (whole rows): fewer made the many small ops of 576-wide rows 2x slower
SUBSCALE_STEPS = 32  # a searched grid's sub-scales: d = max / k for the 32 k nearest the top level (gguf_kquants:
# on normal weights within 0.01 % of every k's squared error, Q6_K's search 4x fewer candidates)
SHRINK = torch.linspace(-1, 1, 21).tolist()  # candidate step sizes: the range spans qmax + r steps (llama.cpp's search)


def search_grid(t: BlockType, w: torch.Tensor, importance: torch.Tensor | None = None) -> Grid:
    """Our weight-only grid for w [O, I]: per group the smallest sum importance[i]*(w - deq)^2 (importance [I],
    E[x_i^2] of the layer's inputs; None: plain MSE) over candidate steps, each refined by least squares, then
    fitted to what the type stores (K-quants: sub-scales chosen for the same weighted error)."""
    check_width(t, w.shape[1])
    rows = max(1, CHUNK // w.shape[1])
    parts = [_search_rows(t, w[r : r + rows].float(), importance) for r in range(0, w.shape[0], rows)]
    return grid_of(t, {k: torch.cat([p[k] for p in parts]) for k in parts[0]})


def _search_rows(t: BlockType, w: torch.Tensor, importance: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """``search_grid``'s stored numbers for the rows w [R, I]."""
    x = grouped(t, w)  # [R, G, g]
    wt = None if importance is None else importance.float().reshape(1, *x.shape[1:]).expand_as(x)  # None: all 1
    if t.symmetric:
        s = _search_symmetric(x, wt, t.half)
        a, b = upward(s, -t.half * s, t.qmax)
    else:
        a, b = _search_affine(x, wt, t.qmax, t.nonpositive_offset)
    centre = x if t.symmetric else x - b[..., None]  # what the step multiplies: its error weighs by it squared
    sa = _weighted(wt, (centre / nonzero(a)[..., None]) ** 2).sum(-1)
    sb = torch.full_like(a, t.group) if wt is None else wt.sum(-1)
    return stored_numbers(t, a, b, sa, sb, SUBSCALE_STEPS)


def _weighted(wt: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """wt * y, where wt None weighs every element 1 (weight-only rounding skips the multiplications)."""
    return y if wt is None else wt * y


def _search_symmetric(x: torch.Tensor, wt: torch.Tensor | None, half: int) -> torch.Tensor:
    """Signed scales s [R, G] for x, wt [R, G, g] on levels -half..half-1 (llama.cpp's make_qx_quants, both signs):
    the least-squares scale of each candidate's levels, the one with the smallest error."""
    top = x.gather(-1, x.abs().argmax(-1, keepdim=True)).squeeze(-1)  # [R, G]: the largest |x|, signed
    wx = _weighted(wt, x)
    best = (torch.full_like(top, torch.inf), torch.zeros_like(top))
    for r in SHRINK:
        for s0 in (top / -(half + r), top / (half - 1 + r)):  # the largest |x| at either end of the levels
            levels = torch.round(x / nonzero(s0)[..., None]).clamp_(-half, half - 1)
            sxl, sll = (wx * levels).sum(-1), (_weighted(wt, levels) * levels).sum(-1)
            _keep(best, -sxl * sxl / nonzero(sll), sxl / nonzero(sll))  # error, less sum wt x^2
    return best[1]


def _search_affine(x: torch.Tensor, wt: torch.Tensor | None, qmax: int, nonpositive: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) [R, G] for x, wt [R, G, g] on codes 0..qmax (llama.cpp's make_qkx2_quants, more candidates): the
    least-squares grid of each candidate's codes (b <= 0 if ``nonpositive``), the one with the smallest error.
    Each candidate's codes start from the best offset found so far (the range's minimum at first): 1 % less
    squared error than always starting from the minimum, on normal weights."""
    lo, hi = x.amin(-1), x.amax(-1)
    lo = lo.clamp(max=0) if nonpositive else lo
    span = nonzero(hi - lo)
    wx = _weighted(wt, x)
    sw = torch.full_like(lo, x.shape[-1]) if wt is None else wt.sum(-1)
    sx, sxx = wx.sum(-1), (wx * x).sum(-1)
    best = (torch.full_like(lo, torch.inf), (hi - lo) / qmax, lo)  # kept where every candidate's codes are alike
    for r in SHRINK:
        q = torch.round((x - best[2][..., None]) * ((qmax + r) / span)[..., None]).clamp_(0, qmax)
        wq = _weighted(wt, q)
        sq, sqq, sxq = wq.sum(-1), (wq * q).sum(-1), (wx * q).sum(-1)
        det = sw * sqq - sq * sq
        a, b = (sw * sxq - sx * sq) / nonzero(det), (sqq * sx - sq * sxq) / nonzero(det)
        if nonpositive:
            a, b = torch.where(b > 0, sxq / nonzero(sqq), a), b.clamp(max=0)
        err = a * a * sqq + 2 * a * b * sq + b * b * sw - 2 * a * sxq - 2 * b * sx + sxx
        _keep(best, torch.where(det > 0, err, torch.inf), a, b)
    return best[1], best[2]


def _keep(best: tuple, err: torch.Tensor, *values: torch.Tensor) -> None:
    """Where err [O, G] beats best[0], take it and ``values`` into ``best`` (updated in place)."""
    better = err < best[0]
    for kept, new in zip(best, (err, *values)):
        torch.where(better, new, kept, out=kept)  # not kept[better] = ...: boolean indexing costs a nonzero() each
