"""AWQ's scale-search round trip (``compress.quant.awq.scaled_round_trip``) in one C pass over the weights:
pseudo_quantize(w * se, spec) / se with the same numbers bit for bit. Built by ``cpu_build``; imports only
torch, the standard library and cpu_build.

Per group of g inputs of a row: v = w * se; grid from the range of v (``primitives.range_qparams``:
asymmetric s = max(max(hi, 0) - min(lo, 0), 1e-8) / qmax, z = clamp(rint(-min(lo, 0) / s), 0, qmax);
symmetric s = max(|hi|, |lo|, 1e-8) / (half - 1), z = half); q = clamp(rint(v / s) + z, 0, qmax) - z;
out = (q * s) / se. Every step is one IEEE operation, as torch's elementwise kernels do it, so the result
does not depend on the vector width; the pragma keeps the compiler from fusing or reassociating them.
The torch expression makes a dozen passes over the weights in memory; this makes one.
"""

import ctypes
import functools

import torch

from compress.kernels import cpu_build

SOURCE = r"""
#pragma GCC optimize ("no-associative-math", "fp-contract=off", "signed-zeros")
#include <math.h>

#define GMAX 256

/* (max, min) of v [g], g a multiple of 16: per lane first, so that the compiler vectorizes it without reordering
   anything but exact comparisons */
static void range16(const float *v, int g, float *hi, float *lo) {
    float h[16], l[16];
    for (int j = 0; j < 16; j++) { h[j] = v[j]; l[j] = v[j]; }
    for (int k = 16; k < g; k += 16)
        for (int j = 0; j < 16; j++) {
            h[j] = v[k + j] > h[j] ? v[k + j] : h[j];
            l[j] = v[k + j] < l[j] ? v[k + j] : l[j];
        }
    for (int j = 1; j < 16; j++) { h[0] = h[j] > h[0] ? h[j] : h[0]; l[0] = l[j] < l[0] ? l[j] : l[0]; }
    *hi = h[0];
    *lo = l[0];
}

/* out[r, :] = round trip of w[r, :] for rows r < n of `cols` floats (row stride `cols`), groups of g */
void round_trip(const float *w, const float *se, float *out, int n, int cols, int g, float qmax, int symmetric,
                float half) {
    float v[GMAX];
    for (int r = 0; r < n; r++) {
        for (int c0 = 0; c0 < cols; c0 += g) {
            const float *wr = w + (size_t)r * cols + c0, *sr = se + c0;
            float *o = out + (size_t)r * cols + c0;
            for (int k = 0; k < g; k++) v[k] = wr[k] * sr[k];
            float hi, lo;
            range16(v, g, &hi, &lo);
            float s, z;
            if (symmetric) {
                float m = fabsf(hi) > fabsf(lo) ? fabsf(hi) : fabsf(lo);
                s = (m > 1e-8f ? m : 1e-8f) / (half - 1.f);
                z = half;
            } else {
                hi = hi > 0.f ? hi : 0.f;
                lo = lo < 0.f ? lo : 0.f;
                float d = hi - lo;
                s = (d > 1e-8f ? d : 1e-8f) / qmax;
                z = rintf(-lo / s);
                z = (float)(int)(z < 0.f ? 0.f : (z > qmax ? qmax : z));  /* torch's int32 zero point: never -0 */
            }
            for (int k = 0; k < g; k++) {
                float q = rintf(v[k] / s) + z;
                q = q < 0.f ? 0.f : (q > qmax ? qmax : q);
                o[k] = ((q - z) * s) / sr[k];
            }
        }
    }
}
"""

_P = ctypes.c_void_p


@functools.cache
def load() -> ctypes.CDLL | None:
    """The built kernel, or None where no C compiler works (or COMPRESS_CPU_KERNELS=0)."""
    return cpu_build.load("round_trip", SOURCE, {
        "round_trip": ([_P, _P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_float, ctypes.c_int, ctypes.c_float],
                       None),
    })


def supports(w: torch.Tensor, se: torch.Tensor, group_size: int) -> bool:
    """Whether ``round_trip`` takes w [O, I] with scales se [I]: both fp32, contiguous, on CPU, groups of 16k <= 256."""
    return (load() is not None and w.device.type == "cpu" and w.dtype == se.dtype == torch.float32
            and w.is_contiguous() and se.is_contiguous() and group_size <= 256 and group_size % 16 == 0 and w.shape[-1] % group_size == 0)


def round_trip(w: torch.Tensor, se: torch.Tensor, out: torch.Tensor, bits: int, group_size: int, symmetric: bool) -> None:
    """out [o, I] <- pseudo_quantize(w * se) / se for the rows w [o, I] (contiguous fp32, like out) and se [I]."""
    qmax, half = 2**bits - 1, 2 ** (bits - 1)
    cpu_build.require(load()).round_trip(w.data_ptr(), se.data_ptr(), out.data_ptr(), w.shape[0], w.shape[1], group_size,
                                         float(qmax), int(symmetric), float(half))
