"""llama.cpp's Q5_0 held in its own 5.5 bits a weight for ``nibble_q8_cpu``'s "fp16 5-bit" entry: each code's low 4
bits as ``nibble_linear_cpu`` lays nibbles out, its fifth bit in a plane of bit masks, and the block's fp16 d,
w = d (q - 16), q in [0, 32). Imports only torch and the sibling kernels' layouts.

Why: held a byte a code with an fp32 scale (``byte_q8_cpu``, 9 bits a weight), a Q4_K_M file of a model whose widths
are not whole 256-weight super-blocks (SmolLM2: 166 of its 210 Linears fall back to Q5_0) read 1.6x the file's bytes
a decode step, and decode is bound by those bytes.

Layout (``pack``), row-major like the weight:
  codes  uint8 [O, I/2]: the low nibbles, ``nibble_linear_cpu.nibbles``
  scales fp16  [O, I/32]: d per block of 32 inputs
  high   uint8 [O, I/8]: per 64 inputs (one 32-byte load of codes) two little-endian 32-bit masks: bit k of the first
         is the fifth bit of the code in byte k's low nibble, of the second of the code in its high nibble, so the
         kernel ORs each mask, spread to bytes, into the nibbles it unpacked (ggml's bytes_from_bits_32).
I must be a multiple of 64 (``supports``).
"""

import torch

from compress.kernels import byte_q8_cpu, nibble_q8_cpu, row_tiles
from compress.kernels.checks import check_bias
from compress.kernels.nibble_linear_cpu import Packed, nibbles

BLOCK = 64  # inputs per pair of masks
GROUP = 32  # inputs per scale (a Q5_0 block)
BITS = 1 << torch.arange(8, dtype=torch.int32)  # [8]: bit t of a byte


def supports(in_features: int) -> bool:
    """Whether a Q5_0 weight of in_features inputs runs here: whole loads of 64 and the int8-activation kernel built."""
    return in_features % BLOCK == 0 and nibble_q8_cpu.load() is not None


def pack(codes: torch.Tensor, scale: torch.Tensor) -> Packed:
    """codes [O, I] in [0, 32) (any integer dtype), scale [O, I/32] that fp16 holds exactly -> (codes [O, I/2],
    scales fp16 [O, I/32], high [O, I/8])."""
    out_features, in_features = codes.shape
    if in_features % BLOCK or scale.shape != (out_features, in_features // GROUP):
        raise ValueError(f"codes {list(codes.shape)} and scale {list(scale.shape)} are not a Q5_0 weight of whole "
                         f"blocks of {BLOCK} inputs")
    if int(codes.min()) < 0 or int(codes.max()) > 31 or not torch.equal(scale.half().float(), scale.float()):
        raise ValueError("Q5_0 codes must lie in [0, 32) and their scales be fp16 values")
    q = codes.to(torch.uint8)
    return nibbles(q & 15), scale.half().contiguous(), plane(q >> 4).view(out_features, -1)


def plane(bit: torch.Tensor) -> torch.Tensor:
    """bit [O, I] (0 or 1 a code) -> uint8 [O, I/64, 8]: per 64 inputs the two masks the kernel reads (bit k of the
    first: the code in byte k's low nibble of its 32-byte load; of the second: in its high nibble)."""
    out_features = bit.shape[0]
    per_load = bit.view(out_features, -1, 2, 2, 16)  # [O, I/64, chunk, low|high nibble, j]
    bits = per_load.transpose(2, 3).reshape(out_features, -1, 8, 8).to(torch.int32)  # [O, I/64, mask byte, bit]
    return (bits * BITS).sum(-1).to(torch.uint8).contiguous()


def plane_bits(masks: torch.Tensor) -> torch.Tensor:
    """``plane``'s inverse: masks uint8 [O, I/8] -> int16 [O, I], 0 or 1 a code, inputs in order."""
    out_features = masks.shape[0]
    bits = (masks.view(out_features, -1, 8, 1).to(torch.int32) & BITS).ne(0)  # [O, I/64, mask byte, bit]
    return bits.view(out_features, -1, 2, 2, 16).transpose(2, 3).reshape(out_features, -1).to(torch.int16)


def low_codes(low: torch.Tensor) -> torch.Tensor:
    """Nibbles [O, I/2] as ``nibbles`` lays them out -> int16 [O, I], inputs in order."""
    halves = low.view(low.shape[0], -1, 1, 16)  # [O, I/32, 1, 16]
    return torch.cat([halves & 15, halves >> 4], dim=2).view(low.shape[0], -1).to(torch.int16)  # [O, I/32, nibble, 16]


def signed_codes(packed: Packed) -> torch.Tensor:
    """int8 [O, I] q - 16: ggml's signed codes, as ``byte_q8_cpu`` holds them."""
    low, _, high = packed
    return (low_codes(low) + 16 * plane_bits(high) - 16).to(torch.int8)


def dequantize(packed: Packed, out: torch.Tensor | None = None) -> torch.Tensor:
    """W [O, I] fp32, into ``out`` where given (``byte_q8_cpu.dequantize``'s buffer rules)."""
    return byte_q8_cpu.dequantize((signed_codes(packed), packed[1].float()), out)


def check(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    low, scales, high = packed
    out_features, in_features = low.shape[0], 2 * low.shape[1]
    shapes = (scales.shape, high.shape) == ((out_features, in_features // GROUP), (out_features, in_features // 8))
    check_codes(x, packed, bias, "Q5_0", in_features % BLOCK == 0 and shapes, (torch.uint8, torch.float16, torch.uint8))


def check_codes(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None, kind: str, shapes: bool,
                dtypes: tuple[torch.dtype, ...]) -> None:
    """The checks of a GGUF type's kernel entry (this one, ``nibble_six``'s): packed (nibbles [O, I/2], scales, bits)
    of the ``kind`` whose shapes it found right, of ``dtypes``; x fp32 [..., I]; all on the CPU."""
    low = packed[0]
    out_features, in_features = low.shape[0], 2 * low.shape[1]
    if low.dim() != 2 or not shapes:
        raise ValueError(f"packed shapes {[list(t.shape) for t in packed]} are not a {kind} weight: use pack()")
    if x.shape[-1] != in_features:
        raise ValueError(f"x must end in {in_features} features, got shape {list(x.shape)}")
    if x.dtype != torch.float32 or tuple(t.dtype for t in packed) != dtypes:
        raise ValueError(f"x must be torch.float32 and the packed tensors {', '.join(map(str, dtypes))}, got "
                         f"{x.dtype}, {', '.join(str(t.dtype) for t in packed)}")
    if not (x.is_cpu and low.is_cpu):
        raise ValueError(f"x and the weight must be on the CPU, got {x.device} and {low.device}")
    check_bias(bias, out_features, torch.float32)


def linear(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None = None) -> torch.Tensor:
    """[..., O] ~ x [..., I] @ W^T (+ bias [O]), fp32 in and out, x rounded to int8 per block of 32."""
    check(x, packed, bias)
    if not supports(x.shape[-1]):
        raise ValueError("the 5-bit kernel needs an x86 CPU with AVX2 and a C compiler")
    low, scales, high = (t.contiguous() for t in packed)
    return nibble_q8_cpu.unchecked(x, (row_tiles.tiled(low), scales, high), bias)
