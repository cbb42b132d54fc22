"""THE packed integer format (layout version 1). Imports only torch.

It is compressed-tensors' "pack-quantized" layout as of compressed-tensors 0.20, so that
vLLM and transformers load what we write:

* Codes are unsigned, q in [0, 2^b) (compressed-tensors stores q - 2^(b-1) as int8 and adds
  the offset back when packing, so the bits are the same).
* A row of C codes is one little-endian bit stream: code i occupies bits [i*b, (i+1)*b) of the
  stream, and stream bit k is bit k % 32 of int32 word k // 32. A code may straddle two words
  (b = 3: codes 10 and 21 do). A row takes ceil(C*b/32) words; the unused high bits of the last
  word are 0.
* b = 4: 8 codes per word, code j of a word in bits [4j, 4j+4). b = 3: 32 codes per 3 words
  (the dense layout; compressed-tensors before 0.12 put 10 codes per word and wasted 2 bits).
* ``weight_packed`` int32 [O, ceil(I*b/32)] packs each output row along the input dim (dim 1).
* ``weight_zero_point`` int32 [ceil(O*b/32), I/g] packs each column of zero points along the
  output dim (dim 0): pack the transpose, transpose back.
"""

import math

import torch

LAYOUT_VERSION = 1


def packed_width(n: int, bits: int) -> int:
    return math.ceil(n * bits / 32)


def to_int32(words: torch.Tensor) -> torch.Tensor:
    # int64 holding 32 unsigned bits -> the int32 with the same bits
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] codes in [0, 2^bits) -> [R, ceil(C*bits/32)] int32 along dim 1."""
    return _pack4(codes) if bits == 4 else pack_stream(codes, bits)


def pack_stream(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """:func:`pack` for any width, straight from the bit-stream definition above."""
    rows, cols = codes.shape
    padded = math.ceil(cols / 32) * 32  # 32 codes fill exactly `bits` words
    v = torch.zeros(rows, padded, dtype=torch.int64, device=codes.device)
    v[:, :cols] = codes.to(torch.int64)
    start = torch.arange(padded, device=codes.device) * bits  # [C'] first stream bit of each code
    word, offset = start // 32, start % 32
    words = torch.zeros(rows, padded // 32 * bits + 1, dtype=torch.int64, device=codes.device)
    words.index_add_(1, word, (v << offset) & 0xFFFFFFFF)
    words.index_add_(1, word + 1, v >> (32 - offset))  # the part that straddles into the next word
    return to_int32(words[:, : packed_width(cols, bits)])


def unpack(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """[R, W] int32 -> [R, cols] uint8 codes; inverse of :func:`pack`."""
    return _unpack4(packed, cols) if bits == 4 else unpack_stream(packed, bits, cols)


def unpack_stream(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """:func:`unpack` for any width, straight from the bit-stream definition above."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    words = torch.nn.functional.pad(words, (0, 1))  # a zero word for the last code's straddle
    start = torch.arange(cols, device=packed.device) * bits
    word, offset = start // 32, start % 32
    lo = words[:, word] >> offset
    hi = words[:, word + 1] << (32 - offset)
    return ((lo | hi) & (2**bits - 1)).to(torch.uint8)


# 4 bits: two codes a byte, the first in the low nibble, and the bytes of a little-endian int32 in order,
# so the stream above is a byte array: no int64 intermediates (8x the codes' size) and no gathers.
LITTLE_ENDIAN = torch.tensor([1], dtype=torch.int32).view(torch.uint8)[0].item() == 1


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    if not LITTLE_ENDIAN:
        raise RuntimeError("the 4-bit packing assumes a little-endian host")
    rows, cols = codes.shape
    padded = -(-cols // 8) * 8
    c = codes.to(torch.uint8)
    if padded != cols:
        c = torch.nn.functional.pad(c, (0, padded - cols))
    return (c[:, 0::2] | (c[:, 1::2] << 4)).reshape(-1).view(torch.int32).view(rows, -1)  # [R, C'/8]


def _unpack4(packed: torch.Tensor, cols: int) -> torch.Tensor:
    if not LITTLE_ENDIAN:
        raise RuntimeError("the 4-bit packing assumes a little-endian host")
    b = packed.reshape(-1).view(torch.uint8).view(packed.shape[0], -1)  # [R, 4W]
    return torch.stack((b & 0xF, b >> 4), dim=-1).flatten(1)[:, :cols].contiguous()


def pack_zero_points(zero: torch.Tensor, bits: int) -> torch.Tensor:
    """[O, G] -> [ceil(O*bits/32), G] int32, packed along the output dim."""
    return pack(zero.t(), bits).t().contiguous()


def unpack_zero_points(packed: torch.Tensor, bits: int, out_features: int) -> torch.Tensor:
    return unpack(packed.t(), bits, out_features).t().contiguous()
