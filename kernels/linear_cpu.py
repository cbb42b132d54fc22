"""y = x W^T (+ b) on CPU, fp32, any number of rows: a small C GEMM built by ``cpu_build`` that reads
W as it is, ``[O, I]`` row-major (an ``nn.Linear`` weight): no packed copy, so a runtime that also
runs torch's GEMM on some row counts holds one weight, not two. Imports only torch, the standard
library and the shared checks (torch and triton).

Why: at the runtime's small row counts (decode, speculative verification, short prompts) torch's
fp32 GEMM repacks W on every call and reads it at a fraction of the memory bandwidth; here each
W row is read once per call. The register tile is RM rows of x by RN rows of W, both contiguous
along I, accumulating RM x RN vectors of the host's width (``cpu_build.PREAMBLE``: 16 floats with
AVX-512, 8 with AVX2, 4 on NEON) and summing each across lanes at the end. Each OpenMP thread takes
a contiguous share of W's rows. When x is too large for L2 it is cut into blocks of ``KC`` inputs
by as many rows as fit 256 KiB, so a tile's x rows come from L2 and its W rows from L1. torch's GEMM
(MKL, oneDNN) is still faster at large row counts; the runtime measures both and picks per row
count (``compress/runtime/kernel_choice.py``).
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build
from compress.kernels.checks import check_bias

TILE = r"""
/* AVX-512 and NEON have 32 vector registers: a 4 x 6 tile (24 accumulators, 6 weights, 1 x);
   AVX2 and SSE have 16: 4 x 3. */
#if VW == 16 || defined(__aarch64__)
#define RN 6
#else
#define RN 3
#endif
#define RM 4
#define KC 512
#define XBLOCK (64 * 1024)  /* floats of x per block: 256 KiB */

/* y[r, n] (+)= x[r, :K] . w[n, :K] for r < rm, n < rn; rows of x are xs floats apart, of w ws, of y ys. With pf,
   W's rows that far ahead are prefetched, once per 64-byte line, where rm > 1 (see linear_cpu.py). */
static inline __attribute__((always_inline)) void tile(const float *x, int xs, const float *w, int ws, float *y, int ys,
                                                       int K, int add, int pf, const int rm, const int rn) {
    vf acc[RM][RN];
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) acc[r][n] = (vf){0};
    int k = 0;
    for (; k + VW <= K; k += VW) {
        if (rm > 1 && pf && (k & 15) == 0) prefetch_rows(w + k, sizeof(float) * ws, rn, pf);
        vf wv[RN];
        for (int n = 0; n < rn; n++) wv[n] = *(const vfu *)(w + (size_t)n * ws + k);
        for (int r = 0; r < rm; r++) {
            const vf xv = *(const vfu *)(x + (size_t)r * xs + k);
            for (int n = 0; n < rn; n++) acc[r][n] += xv * wv[n];
        }
    }
    for (int r = 0; r < rm; r++)
        for (int n = 0; n < rn; n++) {
            float s = hsum(acc[r][n]);
            for (int j = k; j < K; j++) s += x[(size_t)r * xs + j] * w[(size_t)n * ws + j];  /* K % VW inputs */
            float *out = y + (size_t)r * ys + n;
            *out = add ? *out + s : s;
        }
}

/* Every tile size the edges need, each compiled with its loops unrolled (accumulators in registers). */
#define CASE(a, b) case a * 8 + b: if (a <= RM && b <= RN) tile(x, xs, w, ws, y, ys, K, add, pf, a, b); break;
#define CASES(a) CASE(a, 1) CASE(a, 2) CASE(a, 3) CASE(a, 4) CASE(a, 5) CASE(a, 6)
static void any_tile(const float *x, int xs, const float *w, int ws, float *y, int ys, int K, int add, int pf, int rm, int rn) {
    switch (rm * 8 + rn) { CASES(1) CASES(2) CASES(3) CASES(4) }
}

/* Inputs per block when x [M, I] is cut along I: all of them where x fits XBLOCK, else even blocks of about KC
   (a short last block would pay a tile's sums and y's read and write for a few inputs), rounded up to unit
   (whole vectors, or whole groups of a quantized W). */
static inline int block_inputs(int M, int I, int unit) {
    const int blocks = (size_t)M * I <= XBLOCK ? 1 : (I + KC - 1) / KC;
    return ((I + blocks - 1) / blocks + unit - 1) / unit * unit;
}

/* Rows of x per block of kc inputs: as many as fit XBLOCK, in whole tiles. */
static inline int block_rows(int kc) {
    const int mc = XBLOCK / kc;
    return mc < RM ? RM : mc - mc % RM;
}
"""

SOURCE = TILE + r"""
/* From 2 rows on, tiles over rows of at most PF_MAX_I inputs ask for W's rows PF_ROWS ahead: short rows make
   short streams that the hardware prefetchers pick up late (1.1-1.3x at 4-16 rows of SmolLM2's shapes on an AMD
   EPYC); over 4096-input rows the same lost up to 14 % at 16-64 rows, and at 1 row the stream is fast already. */
#define PF_ROWS 8
#define PF_MAX_I 1024
/* y[:, o0:o1] of y [M, O] = x [M, I] @ w [O, I]^T. */
static void rows(const float *x, const float *w, float *y, int M, int O, int I, int o0, int o1) {
    const int pf = I <= PF_MAX_I ? PF_ROWS : 0;
    const int kc = block_inputs(M, I, VW), mc = block_rows(kc);
    for (int k0 = 0; k0 < I; k0 += kc) {
        const int K = I - k0 < kc ? I - k0 : kc;
        for (int m0 = 0; m0 < M; m0 += mc) {
            const int m1 = M - m0 < mc ? M : m0 + mc;
            for (int o = o0; o < o1; o += RN)
                for (int m = m0; m < m1; m += RM)
                    any_tile(x + (size_t)m * I + k0, I, w + (size_t)o * I + k0, I, y + (size_t)m * O + o, O, K, k0 > 0, pf,
                             m1 - m < RM ? m1 - m : RM, o1 - o < RN ? o1 - o : RN);
        }
    }
}

void linear(const float *x, const float *w, float *y, int M, int O, int I, int threads) {
    const int blocks = (O + RN - 1) / RN;
    if (threads > blocks) threads = blocks;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int t = 0; t < threads; t++) {
        int o0, o1;
        share(O, RN, t, threads, &o0, &o1);
        rows(x, w, y, M, O, I, o0, o1);
    }
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    return cpu_build.load("linear", SOURCE, {"linear": ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 4, None)})


def supports(weight: torch.Tensor) -> bool:
    """Whether a Linear with this weight can run here: fp32 on CPU, with the kernel built."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and load() is not None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ weight [O, I]^T (+ bias [O]), fp32, as F.linear."""
    if weight.dim() != 2:
        raise ValueError(f"weight must be a 2-D [out, in] matrix, got shape {list(weight.shape)}")
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"x and weight must be torch.float32, got {x.dtype} and {weight.dtype}")
    if not (x.is_cpu and weight.is_cpu):  # is_cpu: a fifth of the cost of .device.type, on every Linear call
        raise ValueError(f"x and weight must be on the CPU, got {x.device} and {weight.device}")
    check_bias(bias, out_features, torch.float32)
    return unchecked(x, weight.contiguous(), bias)


def unchecked(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear`` without its checks, for a caller that made sure once that the operands pass them
    and that weight is contiguous (the runtime's Linears): the checks cost more than a 1-row call of
    a small Linear's C code."""
    out_features, in_features = weight.shape
    x = x if x.is_contiguous() else x.contiguous()
    y = torch.empty(x.shape[:-1] + (out_features,), dtype=torch.float32)  # [..., O]
    rows = x.numel() // in_features if in_features else 0
    if rows and out_features:
        cpu_build.require(load()).linear(x.data_ptr(), weight.data_ptr(), y.data_ptr(), rows, out_features, in_features,
                                         torch.get_num_threads())
    elif not in_features:  # an empty sum
        y.zero_()
    if bias is not None:
        y += bias
    return y
