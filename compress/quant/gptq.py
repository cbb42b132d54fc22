"""GPTQ's error-feedback rounding (Frantar et al., ICLR 2023) onto grids chosen beforehand. Returns codes only.

Rounding each weight to its nearest grid point ignores that the inputs are correlated: the error of
one column can be partly cancelled by nudging the columns not yet rounded. GPTQ rounds the columns
of W [O, I] one at a time and spreads each column's error over the remaining ones through the
inverse of H = E[x x^T] (the inputs' second moments), which minimizes (W - Q) H (W - Q)^T column by
column. Here every column's grid (scale and zero point per group) is fixed before rounding starts
(AWQ's search chose it), so the result is stored in exactly the format that nearest rounding gives.
"""

import torch

from compress.quant.primitives import IntSpec

DAMP = 0.01  # of H's mean diagonal, added to the diagonal: keeps H invertible for few or degenerate inputs
BLOCK = 128  # columns updated together; the result is the same for any block, only the speed differs


def inverse_factor(h: torch.Tensor, damp: float = DAMP) -> torch.Tensor:
    """Upper Cholesky factor U [I, I] of (H + damp)^-1: row i past the diagonal, over U[i, i], is how column
    i's rounding error moves the columns after it."""
    h = h.float().clone()
    dead = torch.diagonal(h) == 0  # inputs that are always zero: their weights do not matter (and H = 0 has no inverse)
    h[dead, dead] = 1
    h.diagonal().add_(damp * torch.diagonal(h).mean())
    return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)


@torch.no_grad()
def gptq_codes(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: IntSpec,
               damp: float = DAMP, block: int = BLOCK, act_order: bool = True) -> torch.Tensor:
    """uint8 codes [O, I] for w [O, I] on the grid (scale, zero) [O, G], given its inputs' H [I, I].

    ``act_order``: round the columns with the largest input energy (H's diagonal) first, while the most
    columns are left to absorb their error (GPTQ's "desc_act"); the grids stay per group of the original
    column order ("static groups"), so the stored format does not change.
    """
    # A scale that underflowed to 0 (fp16) dequantizes to 0 whatever the code; the clamp only avoids 0/0.
    s = scale.float().clamp(min=torch.finfo(torch.float32).tiny).repeat_interleave(spec.group_size, 1)  # [O, I]
    z = zero.float().repeat_interleave(spec.group_size, 1)  # [O, I]
    if act_order:
        perm = torch.argsort(torch.diagonal(h), descending=True, stable=True)  # [I]
    else:
        perm = torch.arange(w.shape[1], device=w.device)  # [I]
    codes = torch.empty(w.shape, dtype=torch.uint8, device=w.device)
    codes[:, perm] = _codes(w.float()[:, perm], h[perm][:, perm], s[:, perm], z[:, perm], spec, damp, block)
    return codes


def _codes(w: torch.Tensor, h: torch.Tensor, s: torch.Tensor, z: torch.Tensor, spec: IntSpec, damp: float, block: int) -> torch.Tensor:
    """GPTQ over the columns in the order given; w [O, I] is updated in place, s, z [O, I] per column."""
    u = inverse_factor(h, damp)  # [I, I]
    codes = torch.empty(w.shape, dtype=torch.uint8, device=w.device)
    n = w.shape[1]
    for b0 in range(0, n, block):
        b1 = min(b0 + block, n)
        err = torch.empty(w.shape[0], b1 - b0, device=w.device)  # [O, b] scaled errors of this block's columns
        for i in range(b0, b1):
            q = torch.clamp(torch.round(w[:, i] / s[:, i]) + z[:, i], 0, spec.qmax)  # [O]
            codes[:, i] = q.to(torch.uint8)
            e = (w[:, i] - (q - z[:, i]) * s[:, i]) / u[i, i]
            w[:, i + 1 : b1] -= e[:, None] * u[i, i + 1 : b1][None, :]
            err[:, i - b0] = e
        w[:, b1:] -= err @ u[b0:b1, b1:]  # the block's errors reach the later columns in one matmul
    return codes
