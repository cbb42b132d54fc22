"""y = x W^T (+ b) for a few rows of x on CPU: a small C kernel built by ``cpu_build``. Imports only
torch and the standard library.

Why: a decode step at batch 1-8 is a few rows times every weight of the model, bound by reading
the weights. torch's fp32 GEMM reads them at about half the machine's bandwidth for such shapes
(11 GB/s of ~23 on the 2-core CI machine, and slower at 2 rows than at 4); this kernel streams each
weight once per call, 8 output rows at a time that stay in L1 while every x row passes over them
(README, "Speed"). Beyond MAX_ROWS rows torch's GEMM is faster and callers use it.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build

MAX_ROWS = 8

SOURCE = r"""
#include <stddef.h>

#define R 8  /* output rows per inner block: 8 accumulators, 8 weight streams */

void linear(const float *x, const float *w, float *y, int M, int O, int I, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int o = 0; o < O; o += R) {
        const int rows = O - o < R ? O - o : R;
        const float *wo = w + (size_t)o * I;
        for (int m = 0; m < M; m++) {
            const float *xm = x + (size_t)m * I;
            float *ym = y + (size_t)m * O + o;
            if (rows == R) {
                float a[R] = {0};
                for (int i = 0; i < I; i++)
                    for (int r = 0; r < R; r++) a[r] += xm[i] * wo[(size_t)r * I + i];
                for (int r = 0; r < R; r++) ym[r] = a[r];
            } else {
                for (int r = 0; r < rows; r++) {
                    float a = 0.f;
                    for (int i = 0; i < I; i++) a += xm[i] * wo[(size_t)r * I + i];
                    ym[r] = a;
                }
            }
        }
    }
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel, or None where it cannot be built (the caller then runs torch ops)."""
    lib = cpu_build.load("linear", SOURCE)
    if lib is None:
        return None
    lib.linear.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 4
    lib.linear.restype = None
    return lib


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x [..., I] @ weight^T runs this kernel: fp32 on CPU, at most MAX_ROWS rows."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and x.numel() <= MAX_ROWS * x.shape[-1]
            and load() is not None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] = x [..., I] @ weight [O, I]^T (+ bias [O]), fp32."""
    out_features, in_features = weight.shape
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or weight.dtype != torch.float32:
        raise ValueError(f"x and weight must be torch.float32, got {x.dtype} and {weight.dtype}")
    rows = x.reshape(-1, in_features).contiguous()  # [M, I]
    if rows.shape[0] > MAX_ROWS:
        raise ValueError(f"at most {MAX_ROWS} rows, got {rows.shape[0]}")
    weight = weight.contiguous()
    y = torch.empty(rows.shape[0], out_features)  # [M, O]
    cpu_build.require(load()).linear(
        rows.data_ptr(), weight.data_ptr(), y.data_ptr(), rows.shape[0], out_features, in_features, torch.get_num_threads()
    )
    if bias is not None:
        y += bias
    return y.view(*x.shape[:-1], out_features)
