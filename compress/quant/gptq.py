"""GPTQ's error-feedback rounding (Frantar et al., ICLR 2023) onto grids chosen beforehand, and scales refitted to its codes.

Rounding each weight to its nearest grid point ignores that the inputs are correlated: the error of
one column can be partly cancelled by nudging the columns not yet rounded. GPTQ rounds the columns
of W [O, I] one at a time and spreads each column's error over the remaining ones through the
inverse of H = E[x x^T] (the inputs' second moments), which minimizes (W - Q) H (W - Q)^T column by
column. Here every column's grid (scale and zero point per group) is fixed before rounding starts
(AWQ's search chose it), so the result is stored in exactly the format that nearest rounding gives;
``refit_scales`` then moves each group's scale to the best one for the codes chosen.
"""

import torch

from compress.quant.primitives import IntSpec, grouped

DAMP = 0.01  # of H's mean diagonal, added to the diagonal: keeps H invertible for few or degenerate inputs
BLOCK = 128  # columns updated together; the result is the same for any block, only the speed differs
REFIT_ROWS = 256  # output rows per solve: bounds the [rows, G, G, g] intermediate (1.6 GB for a Llama-3-8B down_proj)
RIDGE = 1e-6  # of each row's mean diagonal: pulls a group whose codes all sit on the zero point to its old scale


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
    n = w.shape[1]
    perm = torch.argsort(torch.diagonal(h), descending=True, stable=True) if act_order else torch.arange(n, device=w.device)  # [I]
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


@torch.no_grad()
def refit_scales(w: torch.Tensor, h: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor,
                 spec: IntSpec) -> torch.Tensor:
    """Scales [O, G] (fp32) that minimize (W - Q) H (W - Q)^T for the given codes and zero points.

    GPTQ chose the codes on grids fitted to nearest rounding; with the codes fixed, each row's output
    error is quadratic in its G scales, so the best scales solve a G x G linear system per row.
    """
    g = spec.group_size
    hf = h.float()
    n_groups = scale.shape[1]
    hb = hf.reshape(n_groups, g, n_groups, g).permute(0, 2, 1, 3)  # [G, G, g, g]: H's blocks between groups
    out = torch.empty(scale.shape, dtype=torch.float32, device=w.device)
    eye = torch.eye(n_groups, device=w.device)
    for r0 in range(0, w.shape[0], REFIT_ROWS):
        rows = slice(r0, r0 + REFIT_ROWS)
        d = grouped(codes[rows].float(), g) - zero[rows, :, None].float()  # [R, G, g]: Q = s * d per group
        m = torch.einsum("rai,abij,rbj->rab", d, hb, d)  # [R, G, G]
        v = (grouped(w[rows].float() @ hf, g) * d).sum(-1)  # [R, G]: d_a^T H w
        lam = RIDGE * torch.diagonal(m, dim1=1, dim2=2).mean(-1).clamp(min=1e-30)[:, None]  # [R, 1]
        out[rows] = torch.linalg.solve(m + lam[..., None] * eye, v + lam * scale[rows].float())
    return torch.where(out > 0, out, scale.float())  # a sign flip fits the codes but no longer the grid's range
