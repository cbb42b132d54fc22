"""y = x W^T (+ b) on CPU, fp32, for many rows: W copied per call into panels laid out for an
outer-product micro-kernel, the way BLAS libraries run a GEMM. Imports only torch, the standard
library and the shared checks (torch and triton).

Why: ``linear_cpu``'s tile takes dot products along I (W read as it is, no copy), which is what few
rows want, but each tile ends in RM x RN horizontal sums per block of inputs: at 128-512 rows over
576 inputs those sums cost about as much as the multiply-adds, and that kernel ran at half of torch's
speed there. Here no sum crosses lanes: a panel holds PN outputs by up to PK inputs of W transposed,
``panel[k][n] = W[o + n, k0 + k]``, and the micro-kernel keeps PM rows x PN outputs of y in registers
(AVX-512 and NEON: 6 x 4 vectors, 24 accumulators; AVX2: 6 x 2), each step broadcasting one x value
per row against PN weights. The copy costs one pass over W per call (VW rows by VW inputs at a time,
transposed in registers), paid back from 6-32 rows on where measured (the engine times it against
the other kernels per row count, ``compress/runtime/kernel_choice.py``).

``PANEL`` is the C driver shared by every weight format: a source that includes it defines
``struct wsrc`` (where its W lies) and ``pack_rows(w, o, cnt, k0, K, panel, spare)``, which writes the
inputs k0..k0+K of cnt <= VW outputs from o into the first cnt columns at ``panel`` (``spare``: room for
VW rows of K floats, to dequantize into); the driver walks a panel's outputs VW at a time.
Here W is fp32; ``nibble_panel_cpu`` dequantizes 4-bit codes and ``int8_rows_cpu`` int8 rows
straight into the panel (no dense copy).
Each thread takes a contiguous share of the outputs in whole vectors (of the rows, for a small weight).
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_bias


def _transpose(width: int) -> str:
    """C for a width x width block of vectors transposed in registers: log2(width) stages, each pairing vectors s
    apart and swapping their blocks of s lanes, with the shuffles' lane indices written out as constants (one
    vpermt2ps each with AVX-512; computed in a C loop, GCC built them at run time). ``__builtin_shufflevector``
    is Clang's and GCC's from 12 on; older GCCs have ``__builtin_shuffle`` with a constant index vector."""
    stages, s = [], width // 2
    while s:
        lo = ", ".join(str(width + i - s if i & s else i) for i in range(width))
        hi = ", ".join(str(width + i if i & s else i + s) for i in range(width))
        stages.append(f"    for (int i = 0; i < VW; i++) if (!(i & {s})) {{ const vf a = r[i], b = r[i + {s}];\n"
                      f"        r[i] = SHUFFLE(a, b, {lo}); r[i + {s}] = SHUFFLE(a, b, {hi}); }}")
        s //= 2
    return f"#if VW == {width}\n" + "\n".join(stages) + "\n#endif\n"


TRANSPOSE = r"""
#if defined(__clang__) || __GNUC__ >= 12
#define SHUFFLE(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
typedef int pvi __attribute__((vector_size(VW * 4)));
#define SHUFFLE(a, b, ...) __builtin_shuffle(a, b, (pvi){__VA_ARGS__})
#endif
/* r[0..VW) as a VW x VW block, transposed in registers. */
static inline __attribute__((always_inline)) void transpose(vf r[VW]) {
""" + "".join(_transpose(w) for w in (16, 8, 4)) + "}\n"

PANEL = r"""
#include <stdlib.h>
#if VW == 16 || defined(__aarch64__)
#define PV 4
#else
#define PV 2
#endif
#define PM 6
#define PN (PV * VW)
#define PK 256  /* a panel: PK x PN floats, 64 KiB with AVX-512, held in L2 while every row of x passes over it */

struct wsrc;
static void pack_rows(const struct wsrc *w, int o, int cnt, int k0, int K, float *panel, float *spare);

""" + TRANSPOSE + r"""/* panel[k][j] = rows[j * rs + k] for j < cnt, k < K (panel at a whole vector's column): rows of W, or of a dequantized
   block of them, into panel columns. VW rows at a time go VW inputs by VW in registers: element by element this copy
   took ~2 cycles a weight, 12 % of a 256-row call over 576 inputs. */
static void put_rows(const float *rows, int rs, int cnt, int K, float *panel) {
    int k = 0;
    if (cnt == VW)
        for (; k + VW <= K; k += VW) {
            vf r[VW];
            for (int j = 0; j < VW; j++) r[j] = *(const vfu *)(rows + (size_t)j * rs + k);
            transpose(r);
            for (int j = 0; j < VW; j++) *(vf *)(panel + (size_t)(k + j) * PN) = r[j];
        }
    for (; k < K; k++)
        for (int j = 0; j < cnt; j++) panel[(size_t)k * PN + j] = rows[(size_t)j * rs + k];
}

/* Zeros in columns nn.. of the last vector (its lanes past O are computed, never stored: no stale denormals). */
static void pad(int nn, int K, float *panel) {
    const int end = (nn + VW - 1) / VW * VW;
    for (int k = 0; k < K; k++)
        for (int j = nn; j < end; j++) panel[(size_t)k * PN + j] = 0.f;
}

/* The panel of outputs o..o+nn (nn <= PN), inputs k0..k0+K: the format's pack_rows VW outputs at a time. */
static void pack(const struct wsrc *w, int o, int nn, int k0, int K, float *panel, float *spare) {
    for (int n = 0; n < nn; n += VW) pack_rows(w, o + n, nn - n < VW ? nn - n : VW, k0, K, panel + n, spare);
    pad(nn, K, panel);
}

/* y[r, :nr] (+)= sum over k < K of x[r, k] * panel[k, :] for r < rm; rows of x are xs floats apart, of y ys. */
static inline __attribute__((always_inline)) void micro(const float *x, int xs, const float *panel, float *y, int ys,
                                                        int K, int add, int nr, const int rm, const int nv) {
    vf acc[PM][PV];
    for (int r = 0; r < rm; r++)
        for (int v = 0; v < nv; v++) acc[r][v] = (vf){0};
    for (int k = 0; k < K; k++) {
        vf w[PV];
        for (int v = 0; v < nv; v++) w[v] = *(const vf *)(panel + (size_t)k * PN + v * VW);
        for (int r = 0; r < rm; r++) {
            const vf xb = (vf){0} + x[(size_t)r * xs + k];  /* a broadcast */
            for (int v = 0; v < nv; v++) acc[r][v] += xb * w[v];
        }
    }
    for (int r = 0; r < rm; r++)
        for (int v = 0; v < nv; v++) {
            float *out = y + (size_t)r * ys + v * VW;
            if ((v + 1) * VW <= nr) {
                *(vfu *)out = add ? *(vfu *)out + acc[r][v] : acc[r][v];
            } else {  /* the last vector of the outputs, part of it past O */
                for (int l = 0; l < nr - v * VW; l++) out[l] = add ? out[l] + acc[r][v][l] : acc[r][v][l];
            }
        }
}

#define PCASE(a, b) case a * 8 + b: if (b <= PV) micro(x, xs, panel, y, ys, K, add, nr, a, b); break;
#define PCASES(a) PCASE(a, 1) PCASE(a, 2) PCASE(a, 3) PCASE(a, 4)
static void any_micro(const float *x, int xs, const float *panel, float *y, int ys, int K, int add, int nr, int rm) {
    const int nv = (nr + VW - 1) / VW;
    switch (rm * 8 + nv) { PCASES(1) PCASES(2) PCASES(3) PCASES(4) PCASES(5) PCASES(6) }
}

/* y[:, o0:o1] of y [M, O] = x [M, I] @ W^T, one panel at a time over every row of x; inputs in blocks of kc. */
static int panel_rows(const float *x, const struct wsrc *w, float *y, int M, int O, int I, int kc, int o0, int o1) {
    /* aligned_alloc takes a size in whole alignments (C11; macOS refuses others) */
    float *panel = aligned_alloc(64, (sizeof(float) * (size_t)kc * (PN + VW) + 63) / 64 * 64), *spare = panel + (size_t)kc * PN;
    if (!panel) return 1;
    for (int k0 = 0; k0 < I; k0 += kc) {
        const int K = I - k0 < kc ? I - k0 : kc;
        for (int o = o0; o < o1; o += PN) {
            const int nn = o1 - o < PN ? o1 - o : PN;
            pack(w, o, nn, k0, K, panel, spare);
            for (int m = 0; m < M; m += PM)
                any_micro(x + (size_t)m * I + k0, I, panel, y + (size_t)m * O + o, O, K, k0 > 0, nn, M - m < PM ? M - m : PM);
        }
    }
    free(panel);
    return 0;
}

/* y [M, O] = x [M, I] @ W^T, inputs in even blocks of at most about PK, each a multiple of unit (the format's group):
   a short last block would pay the micro-kernel's loads and stores of y for a few inputs. Threads share the outputs
   in whole vectors, or, where that leaves each fewer than ROWS_SPLIT panels (a small weight, or the first rows of
   one that the engine's timing runs), the rows of x in whole micro-tiles, each thread packing every panel: a thread
   with two panels re-read x for each and scaled 1.5x on two cores. Nonzero where a panel could not be allocated. */
#define ROWS_SPLIT 4
static int panel_linear(const float *x, const struct wsrc *w, float *y, int M, int O, int I, int unit, int threads) {
    const int blocks = (I + PK - 1) / PK, kc = ((I + blocks - 1) / blocks + unit - 1) / unit * unit;
    const int vectors = (O + VW - 1) / VW, tiles = (M + PM - 1) / PM;
    const int by_rows = (O + PN - 1) / PN < ROWS_SPLIT * threads && tiles >= 2 * threads;
    const int units = by_rows ? tiles : vectors, step = by_rows ? PM : VW;
    int failed = 0;
    if (threads > units) threads = units;
#pragma omp parallel for num_threads(threads) schedule(static) reduction(| : failed)
    for (int t = 0; t < threads; t++) {
        const int a = (int)((long)units * t / threads) * step, b = (int)((long)units * (t + 1) / threads) * step;
        if (by_rows ? panel_rows(x + (size_t)a * I, w, y + (size_t)a * O, (b < M ? b : M) - a, O, I, kc, 0, O)
                    : panel_rows(x, w, y, M, O, I, kc, a, b < O ? b : O))
            failed = 1;
    }
    return failed;
}
"""

SOURCE = PANEL + r"""
struct wsrc { const float *w; int I; };

static void pack_rows(const struct wsrc *s, int o, int cnt, int k0, int K, float *panel, float *spare) {
    (void)spare;  /* fp32 rows go in as they are */
    put_rows(s->w + (size_t)o * s->I + k0, s->I, cnt, K, panel);
}

int linear(const float *x, const float *w, float *y, int M, int O, int I, int threads) {
    const struct wsrc s = {w, I};
    return panel_linear(x, &s, y, M, O, I, 1, threads);
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("panel", SOURCE, {"linear": ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 4, ctypes.c_int)})


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ weight [O, I]^T (+ bias [O]), fp32 on the CPU, as F.linear."""
    if weight.dim() != 2 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x {list(x.shape)} and weight {list(weight.shape)} do not make x @ weight^T")
    if x.dtype != torch.float32 or weight.dtype != torch.float32 or not (x.is_cpu and weight.is_cpu):
        raise ValueError(f"x and weight must be torch.float32 on the CPU, got {x.dtype} on {x.device} and "
                         f"{weight.dtype} on {weight.device}")
    check_bias(bias, weight.shape[0], torch.float32)
    return unchecked(x, weight.contiguous(), bias)


def unchecked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that they pass and that weight is contiguous."""
    return call(lambda lib, x, y, rows: lib.linear(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rows, *weight.shape,
                                                   torch.get_num_threads()),
                load(), x, weight.shape[0], weight.shape[1], bias)


def call(run, lib, x: torch.Tensor, out_features: int, in_features: int, bias: torch.Tensor | None) -> torch.Tensor:
    """y [..., O] from ``run(lib, x, y, rows)``, a panel kernel over some weight format (this module's,
    ``nibble_panel_cpu``'s, ``int8_rows_cpu``'s): the shared allocation, empty cases, bias and error."""
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty(x.shape[:-1] + (out_features,), dtype=torch.float32)  # [..., O]
    rows = x.numel() // in_features if in_features else 0
    if rows and out_features:
        if run(cpu_build.require(lib), x, y, rows):
            raise MemoryError(f"the {out_features}x{in_features} panel CPU kernel could not allocate its panel")
    elif not in_features:  # an empty sum
        y.zero_()
    if bias is not None:
        y += bias
    return y
