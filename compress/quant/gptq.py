"""GPTQ's error-feedback rounding (Frantar et al., ICLR 2023) onto grids chosen beforehand. Returns codes only.

Rounding each weight to its nearest grid point ignores that the inputs are correlated: the error of
one column can be partly cancelled by nudging the columns not yet rounded. GPTQ rounds the columns
of W [O, I] one at a time and moves the columns after each one so as to minimize the output error
(W - Q) H (W - Q)^T, H = E[x x^T] (the inputs' second moments). Here every column's grid (scale and
zero point per group) is fixed before rounding starts (AWQ's search chose it), so the result is
stored in exactly the format that nearest rounding gives.

The form used here needs one Cholesky factorization and no inverse. Write H = L^T L with L lower
triangular; then for the errors d = w - q of one row, d H d^T = sum_j (sum_{i<=j} L_ji d_i)^2, and
term j vanishes when column j is at its target w_j + sum_{i<j} d_i L_ji / L_jj. GPTQ rounds each
column's target in turn: the reference implementation's updates through the upper Cholesky factor
of H^-1 (which is L^-T), summed in another order. Columns go in blocks: the targets of a block get
the errors of all earlier blocks in one matmul, then the columns of the block feed each other.
"""

from collections.abc import Callable

import torch

from compress.quant.primitives import IntSpec

DAMP = 0.01  # of H's mean diagonal, added to the diagonal: keeps H invertible for few or degenerate inputs
BLOCK = 32  # columns rounded one by one between two matmuls; the result is the same for any block, only the speed differs


ROWS = 256  # rows per step of the chunked copies below: their temporaries stay small next to the [I, I] fp64 matrix


def damped(h: torch.Tensor, order: torch.Tensor, damp: float = DAMP) -> torch.Tensor:
    """H [I, I] with rows and columns taken in ``order`` [I], as fp64, with damp * its mean diagonal added to the
    diagonal. Copied a block of rows at a time: a whole reordered fp32 copy next to the fp64 one was 1/3 more memory."""
    n = h.shape[0]
    out = torch.empty(n, n, dtype=torch.float64, device=h.device)  # [I, I]
    for r0 in range(0, n, ROWS):
        out[r0 : r0 + ROWS] = h[order[r0 : r0 + ROWS, None], order]
    dead = torch.diagonal(out) == 0  # inputs that are always zero: their weights do not matter (and H = 0 has no inverse)
    out[dead, dead] = 1
    out.diagonal().add_(damp * torch.diagonal(out).mean())
    return out


def cholesky_upper(a: torch.Tensor, block: int = 256) -> torch.Tensor:
    """Upper triangular U [n, n] with a = U^T U for a positive definite a [n, n], by blocks of rows: the same factor
    as torch.linalg.cholesky, without its pass that zeroes the other triangle (as slow as the factorization on CPU).
    Overwrites a with U: block k's rows of a are read only at step k, and a second [n, n] fp64 matrix was the largest
    temporary of an 8B model's quantization."""
    for k0 in range(0, a.shape[0], block):
        k1 = k0 + block
        rows = torch.addmm(a[k0:k1, k0:], a[:k0, k0:k1].T, a[:k0, k0:], alpha=-1)  # [b, n - k0]: less the rows above
        a[k0:k1, k0:k1] = torch.linalg.cholesky(rows[:, :block], upper=True)
        a[k0:k1, k1:] = torch.linalg.solve_triangular(a[k0:k1, k0:k1].mT, rows[:, block:], upper=False)
        a[k1:, k0:k1] = 0  # below the diagonal: no longer read
    return a


def rounding_order(h: torch.Tensor, act_order: bool = True) -> torch.Tensor:
    """[I]: the order in which GPTQ rounds the columns of a Linear whose inputs have H [I, I] (see ``gptq_codes``)."""
    if act_order:
        return torch.argsort(torch.diagonal(h), descending=True, stable=True)
    return torch.arange(h.shape[0], device=h.device)


def feedback(h: torch.Tensor, order: torch.Tensor, damp: float = DAMP) -> torch.Tensor:
    """[I, I] for the columns taken in ``order`` [I]: lower triangular, unit diagonal, row j holds how much of each
    earlier column's rounding error column j's target takes on, L_ji / L_jj for the lower triangular L with
    (damped, reordered) H = L^T L. Factored in fp64: in fp32, the factor of an ill-conditioned H changes more codes
    than the rest of the computation does."""
    n = h.shape[0]
    r = cholesky_upper(damped(h, order.flip(0), damp))  # [I, I]: J H J = R^T R (J reverses), so L = J R J
    diag = torch.diagonal(r).clone()  # [I]
    fb = torch.empty(n, n, dtype=torch.float32, device=h.device)  # [I, I]
    for r0 in range(0, n, ROWS):  # fb[i] = (R[n-1-i] / R_ii).flip: by blocks of rows, as for the copy in ``damped``
        r1 = min(r0 + ROWS, n)
        fb[n - r1 : n - r0] = (r[r0:r1] / diag[r0:r1, None]).float().flip(0, 1)
    return fb


def prepare(h: torch.Tensor, damp: float = DAMP, act_order: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(order [I], feedback [I, I]) of ``gptq_codes`` for inputs with H [I, I]: computed once for the Linears that
    share their inputs (q, k, v; gate, up)."""
    order = rounding_order(h, act_order)
    return order, feedback(h, order, damp)


Snap = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (a column's index in W, its target [O] fp32) -> (what is stored for it [O], the value that stands for [O]), both fp32


@torch.no_grad()
def error_feedback(w: torch.Tensor, h: torch.Tensor, snap: Snap, prepared: tuple[torch.Tensor, torch.Tensor] | None = None,
                   damp: float = DAMP, block: int = BLOCK, act_order: bool = True) -> torch.Tensor:
    """What ``snap`` stores for each weight of w [O, I] (fp32 [O, I]), the columns rounded by GPTQ given the inputs'
    H [I, I]: ``snap`` rounds one column's target to its grid, whatever the grid (integer codes, e4m3 values).
    ``prepared``: ``prepare(h, damp, act_order)`` where it was computed already.

    ``act_order``: round the columns with the largest input energy (H's diagonal) first, while the most
    columns are left to absorb their error (GPTQ's "desc_act"); each column keeps the grid of its own index,
    so the stored format does not change.
    """
    perm, fb = prepared or prepare(h, damp, act_order)  # [I], [I, I]
    cols = perm.tolist()
    # W's columns become rows, in rounding order, so that each one is contiguous.
    q = _rounded(w.float().T.contiguous()[perm], fb, lambda i, target: snap(cols[i], target), block)  # [I, O]
    out = torch.empty_like(q)
    out[perm] = q
    return out.T


@torch.no_grad()
def gptq_codes(w: torch.Tensor, h: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: IntSpec,
               prepared: tuple[torch.Tensor, torch.Tensor] | None = None, damp: float = DAMP, block: int = BLOCK,
               act_order: bool = True) -> torch.Tensor:
    """uint8 codes [O, I] for w [O, I] on the grid (scale, zero) [O, G], given its inputs' H [I, I]: ``error_feedback``
    on fixed integer grids. With act-order the grids stay per group of the original column order ("static groups")."""
    # A scale that underflowed to 0 (fp16) dequantizes to 0 whatever the code; the clamp only avoids 0/0.
    s = scale.float().clamp(min=torch.finfo(torch.float32).tiny).T.contiguous()  # [G, O]
    z = zero.float().T.contiguous()  # [G, O]

    def snap(j: int, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        g = j // spec.group_size
        return _int_snap(target, s[g], z[g], spec.qmax)

    return error_feedback(w, h, snap, prepared, damp, block, act_order).to(torch.uint8).contiguous()


def _int_snap(target: torch.Tensor, s: torch.Tensor, z: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, (codes - z) s) [O] of target [O] on the grid (s, z) [O]."""
    q = torch.div(target, s).round_().add_(z).clamp_(0, qmax)
    return q, (q - z) * s


def _rounded(wt: torch.Tensor, fb: torch.Tensor, snap: Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
             block: int) -> torch.Tensor:
    """What ``snap(i, target)`` stores [I, O] (fp32), by GPTQ over the rows of wt [I, O] (W's columns) in order,
    with the feedback fb [I, I]."""
    q, err = torch.empty_like(wt), torch.empty_like(wt)  # [I, O]: stored, and w - its value
    n = wt.shape[0]
    for b0 in range(0, n, block):
        b1 = min(b0 + block, n)
        target = torch.addmm(wt[b0:b1], fb[b0:b1, :b0], err[:b0])  # [b, O]: with the earlier blocks' errors
        for i in range(b0, b1):
            q[i], value = snap(i, target[i - b0])
            torch.sub(wt[i], value, out=err[i])
            target[i - b0 + 1 :].addr_(fb[i + 1 : b1, i], err[i])  # this column's error, to the rest of the block
    return q
