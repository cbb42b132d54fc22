"""y = x W^T (+ b) on CPU, fp32, any number of rows: a small C GEMM built by ``cpu_build``, over a
weight packed once into panels. Imports only torch, the standard library and the shared checks
(torch and triton).

Why: torch's fp32 GEMM repacks W^T on every call, which at the runtime's shapes (a few to a few
hundred rows times SmolLM2's 576-1536-wide weights) is a large share of the call, and at 1-8 rows
it reads the weights at about half the memory bandwidth. Here W is packed once (``pack``: 16
output rows interleaved, ``[ceil(O/16), I, 16]``) so that a 6-row x 16-column tile of y keeps its
12 vector accumulators in registers while one panel streams through in order; each OpenMP thread
takes whole panels, so a second core helps at every row count (docs/results/speed.md, "CPU kernels":
``python -m compress.bench.cpu_kernels``). The source uses GCC/Clang vector extensions, so it
builds for any target the compiler knows (AVX2, NEON, ...).
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_bias

PANEL = 16  # output rows per panel: two 8-float vectors

SOURCE = r"""
#include <stddef.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));
typedef float v8u __attribute__((vector_size(32), aligned(4)));

/* A tile of NR <= 6 rows of x times one panel: 2 * NR accumulators that never leave registers.
   From 2 rows on, the FMAs keep the core busy enough that the hardware prefetcher falls behind the
   panel stream: asking for the weights PREFETCH rows (4 KiB) ahead took 5 rows from 1.6x the time
   of 1 row to 1.2x on a Zen core (a prefetch never faults, so running past the panel's end is harmless). */
#define PREFETCH 64
#define ACC(r) v8 a##r##0 = {0}, a##r##1 = {0};
#define FMA(r) if (NR > r) { const float b = x[(size_t)(r) * I + i]; a##r##0 += b * w0; a##r##1 += b * w1; }
#define STORE(r) if (NR > r) { *(v8u *)(y + (size_t)(r) * ys) = a##r##0; *(v8u *)(y + (size_t)(r) * ys + 8) = a##r##1; }
#define TILE(ROWS) \
static void tile##ROWS(const float *x, const float *p, float *y, int I, int ys) { \
    enum { NR = ROWS }; \
    ACC(0) ACC(1) ACC(2) ACC(3) ACC(4) ACC(5) \
    for (int i = 0; i < I; i++) { \
        if (NR > 1) __builtin_prefetch(p + (size_t)(i + PREFETCH) * 16, 0, 0); \
        const v8 w0 = *(const v8u *)(p + (size_t)i * 16), w1 = *(const v8u *)(p + (size_t)i * 16 + 8); \
        FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) \
    } \
    STORE(0) STORE(1) STORE(2) STORE(3) STORE(4) STORE(5) \
}
TILE(1) TILE(2) TILE(3) TILE(4) TILE(5) TILE(6)

typedef void (*tile_fn)(const float *, const float *, float *, int, int);
static const tile_fn TILES[7] = {0, tile1, tile2, tile3, tile4, tile5, tile6};

/* y [M, O] = x [M, I] @ W^T, p = W packed as [ceil(O / 16), I, 16], zero-padded. */
void linear(const float *x, const float *p, float *y, int M, int O, int I, int threads) {
    const int panels = (O + 15) / 16;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int c = 0; c < panels; c++) {
        const float *pc = p + (size_t)c * I * 16;
        const int cols = O - c * 16 < 16 ? O - c * 16 : 16;
        for (int m = 0; m < M; m += 6) {
            const int rows = M - m < 6 ? M - m : 6;
            if (cols == 16) {
                TILES[rows](x + (size_t)m * I, pc, y + (size_t)m * O + c * 16, I, O);
            } else {  /* the ragged last panel: through a scratch tile, so padding is never stored */
                float t[6 * 16];
                TILES[rows](x + (size_t)m * I, pc, t, I, 16);
                for (int r = 0; r < rows; r++) memcpy(y + (size_t)(m + r) * O + c * 16, t + r * 16, cols * sizeof(float));
            }
        }
    }
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("linear", SOURCE, "linear", [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4)


def supports(weight: torch.Tensor) -> bool:
    """Whether a Linear with this weight can run here: fp32 on CPU, with the kernel built."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and load() is not None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [O, I] -> panels [ceil(O/16), I, 16]: panel c, row i holds weight[16c:16c+16, i] (zeros past O)."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise ValueError(f"weight must be a 2-D torch.float32 matrix, got {weight.dtype} of shape {list(weight.shape)}")
    return panels_of(weight)


def panels_of(t: torch.Tensor) -> torch.Tensor:
    """[O, K] of any dtype -> [ceil(O/16), K, 16]: 16 rows interleaved per panel, zeros past O."""
    out_features, k = t.shape
    padded = t
    if out_features % PANEL:  # else no padded copy: an lm_head's is as large as the weight
        padded = t.new_zeros(-(-out_features // PANEL) * PANEL, k)
        padded[:out_features] = t
    return padded.view(-1, PANEL, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, panels: torch.Tensor, out_features: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ W [O, I]^T (+ bias [O]), fp32, with panels = pack(W)."""
    if panels.dim() != 3 or panels.shape[0] != -(-out_features // PANEL) or panels.shape[2] != PANEL:
        raise ValueError(f"panels of shape {list(panels.shape)} do not pack {out_features} output rows: use pack(weight)")
    in_features = panels.shape[1]
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or panels.dtype != torch.float32:
        raise ValueError(f"x and panels must be torch.float32, got {x.dtype} and {panels.dtype}")
    if not (x.is_cpu and panels.is_cpu):  # is_cpu: a fifth of the cost of .device.type, on every Linear call
        raise ValueError(f"x and panels must be on the CPU, got {x.device} and {panels.device}")
    check_bias(bias, out_features, torch.float32)
    rows = x.reshape(-1, in_features).contiguous()  # [M, I]
    panels = panels.contiguous()
    y = torch.empty(rows.shape[0], out_features, dtype=torch.float32)  # [M, O]
    cpu_build.require(load()).linear(
        rows.data_ptr(), panels.data_ptr(), y.data_ptr(), rows.shape[0], out_features, in_features, torch.get_num_threads()
    )
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], out_features)
