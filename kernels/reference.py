"""Plain-torch reference of every kernel: the test oracle, and the CPU path of the runtime.

Imports only torch. Layouts are those of ``compress.quant.packing`` (pack-quantized, dense
little-endian bit stream per row); this file decodes them on its own, written as bit planes
rather than word arithmetic, so that a test comparing the two checks the layout twice.
"""

import torch


def unpack_rows(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """[R, W] int32 -> [R, cols] int32 codes, reading the stream 32 codes (= `bits` words) at a time."""
    rows, width = packed.shape
    groups = -(-width // bits)
    words = torch.nn.functional.pad(packed, (0, groups * bits - width)).view(rows, groups, bits)
    shifts = torch.arange(32, device=packed.device, dtype=torch.int32)
    stream = (words[..., None] >> shifts) & 1  # [R, G, bits, 32]: bit k of word w
    stream = stream.reshape(rows, groups, 32, bits)  # 32 codes of `bits` stream bits each
    weights = (1 << torch.arange(bits, device=packed.device, dtype=torch.int32))
    codes = (stream * weights).sum(-1, dtype=torch.int32)  # [R, G, 32]
    return codes.reshape(rows, groups * 32)[:, :cols]


def dequantize_packed(
    packed: torch.Tensor,  # [O, ceil(I*bits/32)] int32
    scale: torch.Tensor,  # [O, I/g]
    zero_packed: torch.Tensor | None,  # [ceil(O*bits/32), I/g] int32, None = symmetric
    bits: int,
    in_features: int,
) -> torch.Tensor:
    """The weight [O, I] in scale's dtype: (q - z) * s per group."""
    out_features, groups = scale.shape
    q = unpack_rows(packed, bits, in_features).view(out_features, groups, -1)  # [O, G, g]
    if zero_packed is None:
        z = torch.full_like(scale, 2 ** (bits - 1))
    else:
        z = unpack_rows(zero_packed.t().contiguous(), bits, out_features).t().to(scale.dtype)  # [O, G]
    return ((q.to(scale.dtype) - z[..., None]) * scale[..., None]).view(out_features, in_features)


def dequant_matmul(x, packed, scale, zero_packed, bits: int, bias: torch.Tensor | None = None):
    """y [..., O] = x [..., I] @ dequant(W).T (+ bias)."""
    w = dequantize_packed(packed, scale, zero_packed, bits, x.shape[-1]).to(x.dtype)
    return torch.nn.functional.linear(x, w, bias)
