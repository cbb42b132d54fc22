"""Rotary position embedding on CPU in one C pass: ``x * cos + rotate_half(x) * sin`` for fp32 tensors, bit
for bit what the torch expression (``compress.model.decoder.apply_rope``) computes. Built by ``cpu_build``;
imports only torch, the standard library and cpu_build.

Why: the torch expression is eight ops (two products, a negation, a concatenation, a sum, views); at a
decode step's one row each costs a few microseconds of dispatch, ~25 us for q and k of a layer, 1.5 ms of
SmolLM2's 30-layer step. Here it is one call. The same three roundings as torch (x * cos, the rotated
product, their sum), with no fused multiply-add (the pragma): the numbers do not move.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build

SOURCE = r"""
#pragma GCC optimize ("fp-contract=off")

/* x, out [T, H, D] (rows of H heads), cos, sin [T, D]; the first and second halves of each head rotate */
void rope(const float *x, const float *cos, const float *sin, float *out, int T, int H, int D, int threads) {
    const int half = D / 2;
#pragma omp parallel for num_threads(threads) if ((long)T * H * D > (1 << 18))
    for (int t = 0; t < T; t++) {
        const float *c = cos + (size_t)t * D, *s = sin + (size_t)t * D;
        for (int h = 0; h < H; h++) {
            const float *xh = x + ((size_t)t * H + h) * D;
            float *o = out + ((size_t)t * H + h) * D;
            for (int d = 0; d < half; d++) {
                float a = xh[d] * c[d], b = -xh[d + half] * s[d];
                o[d] = a + b;
            }
            for (int d = half; d < D; d++) {
                float a = xh[d] * c[d], b = xh[d - half] * s[d];
                o[d] = a + b;
            }
        }
    }
}
"""


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel, or None where no C compiler works (or COMPRESS_CPU_KERNELS=0)."""
    return cpu_build.load("rope", SOURCE, {"rope": ([ctypes.c_void_p] * 4 + [ctypes.c_int] * 4, None)})


def supports(x: torch.Tensor, cos: torch.Tensor) -> bool:
    """Whether ``rope`` takes x [B, T, H, D] with tables cos [B, T, D]: fp32 CPU tensors, D even, no autograd."""
    return (x.device.type == "cpu" and x.dtype == cos.dtype == torch.float32 and x.dim() == 4 and x.shape[-1] % 2 == 0
            and cos.shape == (*x.shape[:2], x.shape[-1]) and not (torch.is_grad_enabled() and x.requires_grad)
            and load() is not None)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D] rotated by the tables cos, sin [B, T, D] (``supports`` first): a new contiguous tensor."""
    B, T, H, D = x.shape
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    load().rope(x.data_ptr(), cos.data_ptr(), sin.data_ptr(), out.data_ptr(), B * T, H, D, torch.get_num_threads())
    return out
