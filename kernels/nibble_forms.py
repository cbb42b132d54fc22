"""The forms a packed int4 weight's scales and offsets take (``nibble_linear_cpu.pack`` gives fp32 both): fp16 both,
or fp16 scales and no offsets where each offset is -8 times its scale (llama.cpp's Q4_0), made by ``compact`` where
fp16 holds every value exactly, and widened back to fp32 by ``expanded``. ``nibble_q8_cpu`` reads all three (one C
entry each); the fp32 kernel and the panel GEMM read the fp32 form. Imports only torch and nibble_linear_cpu's check.
"""

import torch

from compress.kernels.nibble_linear_cpu import Packed, check


def form(packed: Packed) -> str:
    """How packed holds its scales and offsets: "fp32" (``pack``), or as ``compact`` makes them "fp16" or
    "fp16 symmetric" (no offsets: w = s (q - 8))."""
    if packed[1].dtype == torch.float32:
        return "fp32"
    return "fp16" if packed[2].numel() else "fp16 symmetric"


def compact(packed: Packed) -> Packed:
    """packed with fp16 scales, and fp16 offsets or none where every group's is -8 times its scale (llama.cpp's Q4_0,
    w = d (q - 8)), where fp16 holds every value exactly (a GGUF's Q4_0 / Q4_1, whose d and m are fp16); else packed
    as it is. Why: at g32 fp32 scales and offsets are a third of the bytes a decode step reads (6 bits a weight,
    4.5 as Q4_0). A group whose offset is -7 times its scale (a Q4_0 block with d < 0, read as s = -d, codes 15 - q
    and zero point 7) is mirrored back: s (q' - 7) = (-s) ((15 - q') - 8), exactly."""
    codes, scales, offsets = packed
    if scales.dtype != torch.float32:
        return packed
    half = scales.half()
    if not torch.equal(half.float(), scales):
        return packed
    mirror = offsets == -7 * scales  # [O, G]
    if bool((mirror | (offsets == -8 * scales)).all()):
        groups = codes.view(codes.shape[0], scales.shape[1], -1)  # [O, G, group / 2]: a group's nibbles are contiguous
        codes = torch.where(mirror[..., None], groups ^ 0xFF, groups).view(codes.shape)  # 15 - q in both nibbles
        return codes, torch.where(mirror, -scales, scales).half(), torch.empty((offsets.shape[0], 0), dtype=torch.float16)
    low = offsets.half()
    return (codes, half, low) if torch.equal(low.float(), offsets) else packed


def expanded(packed: Packed) -> Packed:
    """packed with fp32 scales and offsets, as ``pack`` gives them (what the fp32 and panel kernels read)."""
    codes, scales, offsets = packed
    if scales.dtype == torch.float32:
        return packed
    wide = scales.float()
    return codes, wide, offsets.float() if offsets.numel() else -8 * wide


def check_form(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    """``check`` for any of the forms: fp16 scales with fp16 offsets of their shape, or with none ([O, 0])."""
    codes, scales, offsets = packed
    if scales.dtype == torch.float16 and (offsets.dtype != torch.float16 or offsets.shape not in (scales.shape, (scales.shape[0], 0))):
        raise ValueError(f"fp16 scales {list(scales.shape)} need fp16 offsets of their shape or [O, 0], "
                         f"got {offsets.dtype} {list(offsets.shape)}: use compact()")
    check(x, expanded(packed), bias)
