"""Pack-quantized weights (``compress.quant.packing``'s layout) decoded by word arithmetic, for bit widths
whose codes never straddle an int32 word (2, 4, 8): one shift and mask per code instead of the reference's
32 bit planes per word. The path of ``dequant_matmul`` and ``dequantize_packed`` wherever the fused Triton
kernel does not run (CPU: AWQ's calibration passes through quantized blocks, evaluation of a packed
model): ~10x faster than ``reference.py``, whose bit planes stay the test oracle. Imports only torch.
"""

import torch


def supports(bits: int) -> bool:
    return 32 % bits == 0


def unpack_rows(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """[R, W] int32 -> [R, cols] int32 codes: code j is bits [bits * j, bits * (j + 1)) of the row's little-endian stream."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int32)  # [32 / bits]
    codes = (packed[..., None] >> shifts).bitwise_and_((1 << bits) - 1)  # [R, W, 32 / bits]
    return codes.view(packed.shape[0], packed.shape[1] * per_word)[:, :cols]


def dequantize_packed(packed: torch.Tensor, scale: torch.Tensor, zero_packed: torch.Tensor | None, bits: int,
                      in_features: int) -> torch.Tensor:
    """The weight [O, I] in scale's dtype: (q - z) * s per group (``reference.dequantize_packed``'s contract)."""
    out_features, groups = scale.shape
    q = unpack_rows(packed, bits, in_features).view(out_features, groups, -1)  # [O, G, g]
    if zero_packed is None:
        z = torch.full_like(scale, 2 ** (bits - 1))
    else:
        z = unpack_rows(zero_packed.t().contiguous(), bits, out_features).t().to(scale.dtype)  # [O, G]
    w = q.to(scale.dtype).sub_(z[..., None]).mul_(scale[..., None])  # in place: the reference's (q - z) * s
    return w.view(out_features, in_features)


def dequant_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None):
    """y [..., O] = x [..., I] @ dequant(W).T (+ bias)."""
    w = dequantize_packed(packed, scale, zero_packed, bits, x.shape[-1]).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)
