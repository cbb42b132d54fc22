"""y = x dequant(W)^T (+ b) on CPU, fp32 activations, for many rows of x: ``panel_cpu``'s GEMM over
panels dequantized per call straight from the codes of ``nibble_linear_cpu.pack`` (no dense copy of
W). Imports only torch, the standard library and the shared checks (torch and triton).

Each block of VW rows (the driver's ``pack_rows``) is dequantized VW weights of a row at a time in registers (``nibble_linear_cpu``'s
table lookup, the group's table per row), the VW x VW block transposed in registers and stored as
VW vectors of a panel; a last block of fewer rows goes through the driver's spare buffer.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build, panel_cpu
from compress.kernels.nibble_linear_cpu import NIBBLES, Packed, check

SOURCE = NIBBLES + panel_cpu.PANEL + r"""
/* Each block of VW rows asks for the codes of the block this many blocks ahead: a row's part of a panel is 128
   bytes, too short a stream for the hardware prefetchers; streamed from memory, the pack otherwise ran below the
   4-bit kernel (which prefetches too) at 6-16 rows. */
#define PF_BLOCKS 2
struct wsrc { const unsigned char *q; const float *sc, *of; int I, G; };

/* VW rows: each VW-weight piece of them dequantized in registers (the group's table per row) and transposed into place;
   a last block of fewer rows is dequantized into spare and put in place. */
static void pack_rows(const struct wsrc *s, int o, int cnt, int k0, int K, float *panel, float *spare) {
    const int gs = s->I / s->G, g0 = k0 / gs;
    const unsigned char *q = s->q + (size_t)o * (s->I / 2);
    const float *sc = s->sc + (size_t)o * s->G, *of = s->of + (size_t)o * s->G;
    if (cnt < VW) {
        dequant_rows(q, sc, of, spare, K, cnt, s->I, s->G, gs, g0, K);
        put_rows(spare, K, cnt, K, panel);
        return;
    }
    q += k0 / 2;
    for (int b = 0; b < K / 2; b += 64) prefetch_rows(q + b, s->I / 2, VW, PF_BLOCKS * VW);
    for (int g = 0; g < K / gs; g++) {
        deq d[VW];
        for (int j = 0; j < VW; j++) d[j] = deq_of(sc[(size_t)j * s->G + g0 + g], of[(size_t)j * s->G + g0 + g]);
        for (int k = g * gs; k < (g + 1) * gs; k += 32)
            for (int v = 0; v < 32 / VW; v++) {
                vf r[VW];
                for (int j = 0; j < VW; j++) r[j] = piece(q + (size_t)j * (s->I / 2) + k / 2, v, d[j]);
                transpose(r);
                for (int j = 0; j < VW; j++) *(vf *)(panel + (size_t)(k + v * VW + j) * PN) = r[j];
            }
    }
}

/* y [M, O] = x [M, I] @ dequant(W)^T over panels of whole groups. */
int panel(const float *x, const unsigned char *q, const float *sc, const float *of, float *y, int M, int O, int I, int G,
          int threads) {
    const struct wsrc s = {q, sc, of, I, G};
    return panel_linear(x, &s, y, M, O, I, I / G, threads);
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs another path)."""
    return cpu_build.load("nibble_panel", SOURCE, {"panel": ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 5, ctypes.c_int)})


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ dequant(W)^T (+ bias [O]), fp32, with packed = ``nibble_linear_cpu.pack(...)``."""
    check(x, packed, bias)
    return unchecked(x, tuple(t.contiguous() for t in packed), bias)


def unchecked(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass (the runtime's Linears)."""
    codes, scales, offsets = packed
    out_features, in_features = codes.shape[0], 2 * codes.shape[1]
    return panel_cpu.call(lambda lib, x, y, rows: lib.panel(x.data_ptr(), codes.data_ptr(), scales.data_ptr(), offsets.data_ptr(),
                                                            y.data_ptr(), rows, out_features, in_features, scales.shape[1],
                                                            torch.get_num_threads()),
                          load(), x, out_features, in_features, bias)
