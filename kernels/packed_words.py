"""Pack-quantized weights (``compress.quant.packing``'s layout) decoded by word arithmetic, for bit widths
whose codes never straddle an int32 word (2, 4, 8): one shift and mask per code instead of the reference's
32 bit planes per word. The path of ``dequant_matmul`` and ``dequantize_packed`` wherever the fused Triton
kernel does not run (CPU: AWQ's calibration passes through quantized blocks, evaluation of a packed
model): ~10x faster than ``reference.py``, whose bit planes stay the test oracle. Imports only torch and the reference.
"""

import torch

from compress.kernels import reference


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
    """The weight [O, I] in scale's dtype: ``reference.dequantize_packed`` with this file's unpacking."""
    return reference.dequantize_packed(packed, scale, zero_packed, bits, in_features, unpack_rows)


def dequant_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None):
    """y [..., O] = x [..., I] @ dequant(W).T (+ bias)."""
    return reference.dequant_matmul(x, packed, scale, zero_packed, bits, bias, unpack_rows)
