"""llama.cpp's Q6_K held in its own bits for ``nibble_q8_cpu``'s "6-bit super-block" entry: each code's low 4 bits as
``nibble_linear_cpu`` lays nibbles out, its bits 4 and 5 as 2-bit crumbs beside them (ggml's qh), and per super-block
of 256 inputs sixteen int8 sub-scales and one fp32 unit, w = unit k (q - 32), q in [0, 64). Imports only torch and
the sibling kernels.

Why: held a byte a code with an fp32 scale per 16 (``byte_q8_cpu``, 10 bits a weight) a Q4_K_M file's Q6_K Linears
(attn_v and ffn_down in about half the layers) read 1.5x their file's 6.56 bits a decode step; here 6.625.

Layout (``pack``), row-major like the weight:
  codes  uint8 [O, I/2]: the low nibbles, ``nibble_linear_cpu.nibbles``
  scales uint8 [O, I/256, 20]: per super-block its 16 sub-scales k (int8, one per 16 inputs) and the unit's fp32
         bytes; the sub-scales are the file's d * sc taken apart again exactly (``sub_scales.factor_signed``)
  high   uint8 [O, I/4]: per 128 inputs (two 32-byte loads of codes, blocks 2c and 2c + 1) 32 bytes: byte j holds
         the top 2 bits of the codes in byte j's low nibble (bits 0-1) and high nibble (bits 2-3) of block 2c, and
         of block 2c + 1 (bits 4-5, 6-7): the kernel masks and shifts them into place. The runtime holds them tiled
         by 4 rows as the codes (``row_tiles``): read row by row beside the tiled codes, they held the kernel to
         ~20 GB/s on a host that reads ~30
I must be a multiple of 256 (``supports``; a Q6_K tensor always is).
"""

import torch

from compress.kernels import byte_q8_cpu, nibble_q8_cpu, row_tiles
from compress.kernels.nibble_five import check_codes, low_codes
from compress.kernels.nibble_linear_cpu import Packed, nibbles
from compress.kernels.sub_scales import factor_signed

SUPER = 256  # inputs per super-block
GROUP = 16  # inputs per sub-scale
SUB = SUPER // GROUP  # sub-scales per super-block
BYTES = SUB + 4  # a super-block's scale bytes: the sub-scales, then the unit
SHIFTS = torch.tensor([0, 2, 4, 6], dtype=torch.int32).view(1, 1, 2, 1, 2, 1)  # a crumb's place: 2 (2 block + nibble)
ROWS = 4096  # rows packed at a time: an 8B model's output layer (151,936 x 4096) would take GBs of temporaries at once


def supports(in_features: int) -> bool:
    """Whether a Q6_K weight of in_features inputs runs here: whole super-blocks and the int8-activation kernel built."""
    return in_features % SUPER == 0 and nibble_q8_cpu.load() is not None


def super_scales(scale: torch.Tensor) -> torch.Tensor | None:
    """scale [O, I/16] fp32 (a Q6_K's d * sc) -> uint8 [O, I/256, 20] (the layout's scales), or None where some
    super-block's are not one unit times int8s."""
    if scale.shape[1] % SUB:
        return None
    chunks = []
    for rows in scale.split(ROWS):
        parts = factor_signed(rows.float().reshape(-1, SUB))  # [R * I/256] units, [R * I/256, 16] int8
        if parts is None:
            return None
        unit, k = parts
        chunks.append(torch.cat([k.view(torch.uint8), unit[:, None].contiguous().view(torch.uint8)], 1).view(len(rows), -1, BYTES))
    return torch.cat(chunks)


def wide_scales(scales: torch.Tensor) -> torch.Tensor:
    """The layout's scales uint8 [O, I/256, 20] -> fp32 [O, I/16]: unit times each sub-scale, the file's d * sc."""
    k = scales[..., :SUB].contiguous().view(torch.int8).float()  # [O, I/256, 16]
    unit = scales[..., SUB:].contiguous().view(torch.float32)  # [O, I/256, 1]
    return (unit * k).view(scales.shape[0], -1)


def pack(codes: torch.Tensor, scales: torch.Tensor) -> Packed:
    """codes [O, I] in [0, 64) (any integer dtype), scales from ``super_scales`` -> (codes [O, I/2], scales
    [O, I/256, 20], high [O, I/4])."""
    out_features, in_features = codes.shape
    if in_features % SUPER or scales.shape != (out_features, in_features // SUPER, BYTES) or scales.dtype != torch.uint8:
        raise ValueError(f"codes {list(codes.shape)} and scales {scales.dtype} {list(scales.shape)} are not a Q6_K weight "
                         f"of whole super-blocks of {SUPER} inputs: use super_scales()")
    if int(codes.min()) < 0 or int(codes.max()) > 63:
        raise ValueError("Q6_K codes must lie in [0, 64)")
    low, high = torch.empty(out_features, in_features // 2, dtype=torch.uint8), torch.empty(out_features, in_features // 4, dtype=torch.uint8)
    for at in range(0, out_features, ROWS):
        q = codes[at:at + ROWS].to(torch.uint8)
        low[at:at + ROWS] = nibbles(q & 15)
        crumbs = (q >> 4).view(len(q), -1, 2, 2, 2, 16)  # [R, I/128, block, chunk, nibble, j]
        shifted = crumbs.to(torch.int32) << SHIFTS  # at bits 2 (2 block + nibble)
        high[at:at + ROWS] = shifted.sum((2, 4)).to(torch.uint8).view(len(q), -1)  # [R, I/128, chunk, j]: byte 16 chunk + j
    return low, scales.contiguous(), high


def signed_codes(packed: Packed) -> torch.Tensor:
    """int8 [O, I] q - 32: ggml's signed codes, as ``byte_q8_cpu`` holds them."""
    low, _, high = packed
    out_features = high.shape[0]
    crumbs = (high.view(out_features, -1, 1, 2, 1, 16).to(torch.int32) >> SHIFTS) & 3  # [O, I/128, block, chunk, nibble, j]
    return (low_codes(low) + 16 * crumbs.view(out_features, -1).to(torch.int16) - 32).to(torch.int8)


def dequantize(packed: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    """W [O, I] fp32, into ``out`` where given (``byte_q8_cpu.dequantize``'s buffer rules)."""
    return byte_q8_cpu.dequantize((signed_codes(packed), wide_scales(packed[1])), out)


def check(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    low, scales, high = packed
    out_features, in_features = low.shape[0], 2 * low.shape[1]
    shapes = (scales.shape, high.shape) == ((out_features, in_features // SUPER, BYTES), (out_features, in_features // 4))
    check_codes(x, packed, bias, "Q6_K", in_features % SUPER == 0 and shapes, (torch.uint8,) * 3)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] ~ x [..., I] @ W^T (+ bias [O]), fp32 in and out, x rounded to int8 per block of 32."""
    check(x, packed, bias)
    if not supports(x.shape[-1]):
        raise ValueError("the 6-bit kernel needs an x86 CPU with AVX2 and a C compiler")
    low, scales, high = (t.contiguous() for t in packed)
    return nibble_q8_cpu.unchecked(x, (row_tiles.tiled(low), scales, row_tiles.tiled(high)), bias)
