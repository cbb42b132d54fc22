"""RMSNorm on CPU in one C pass per row: ``x / sqrt(mean(x^2) + eps) * w`` for fp32 rows. Built by
``cpu_build``; imports only torch, the standard library and cpu_build.

Why: ``F.rms_norm`` on one 576-wide row takes 15-35 us here (its dispatch and the thread pool, for ~1 us of
arithmetic), and a decode step of SmolLM2 calls it 61 times: ~2 ms of a ~24 ms step. The sum of squares is
in a different order than torch's, so results agree to a few units in the last place, not bit for bit; the
runtime swaps it in (``runtime/cpu_norms.py``), the reference model keeps torch's.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build

SOURCE = r"""
#include <math.h>

/* out[r] = (x[r] * (1 / sqrt(mean(x[r]^2) + eps))) * w for rows of n floats */
void rms_norm(const float *x, const float *w, float *out, int rows, int n, float eps, int threads) {
#pragma omp parallel for num_threads(threads) if ((long)rows * n > (1 << 18))
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * n;
        float *o = out + (size_t)r * n, ss = 0.f;
        for (int k = 0; k < n; k++) ss += xr[k] * xr[k];
        float inv = 1.f / sqrtf(ss / n + eps);
        for (int k = 0; k < n; k++) o[k] = xr[k] * inv * w[k];
    }
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel, or None where no C compiler works (or COMPRESS_CPU_KERNELS=0)."""
    return cpu_build.load("rms_norm", SOURCE, {
        "rms_norm": ([ctypes.c_void_p] * 3 + [ctypes.c_int] * 2 + [ctypes.c_float, ctypes.c_int], None),
    })


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``rms_norm`` takes x [..., n] with weight [n]: fp32 CPU tensors, no autograd."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32 and weight.shape == x.shape[-1:]
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)) and load() is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., n] normalized per row and scaled by weight [n] (``supports`` first): a new contiguous tensor."""
    x, weight = x.contiguous(), weight.contiguous()
    out = torch.empty_like(x)
    n = x.shape[-1]
    load().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // max(n, 1), n, eps, torch.get_num_threads())
    return out
