"""The forms a packed int4 weight's scales and offsets take (``nibble_linear_cpu.pack`` gives fp32 both): fp16 both,
or fp16 scales and no offsets where each offset is -8 times its scale (llama.cpp's Q4_0), where fp16 holds every
value exactly; or a K-quant's super-blocks (``SUPER``: Q4_K's 8-bit sub-scales and mins, one fp32 unit of each per 8
groups of 32), made by ``compact`` and widened back to fp32 by ``expanded``. ``nibble_q8_cpu`` reads them all (one C
entry each, and Q5_0's and Q6_K's own layouts, ``FIVE`` / ``SIX``); the fp32 kernel and the panel GEMM read the fp32
form. Imports only torch and the sibling kernels.
"""

import torch

from compress.kernels.nibble_linear_cpu import Packed, check
from compress.kernels.sub_scales import factor


FIVE = "fp16 5-bit"  # nibble_five's Q5_0: fp16 scales and a plane of fifth bits in the offsets' place, w = s (q - 16)
SIX = "6-bit super-block"  # nibble_six's Q6_K: int8 sub-scales and a unit per super-block, 2-bit crumbs, w = s (q - 32)
# scales uint8 [O, G, 2]: (k of the scale, k of the offset) per group; offsets fp32 [O, G/8, 2]: their units per 8 groups
SUPER = "super-block"
SUPER_GROUPS = 8  # groups of 32 per super-block (Q4_K's 256 weights)


def form(packed: Packed) -> str:
    """How packed holds its scales and offsets: "fp32" (``pack``), or as ``compact`` makes them "fp16" or
    "fp16 symmetric" (no offsets: w = s (q - 8)) or SUPER; or FIVE or SIX."""
    if packed[1].dtype == torch.float32:
        return "fp32"
    if packed[2].dtype == torch.uint8:
        return SIX if packed[1].dtype == torch.uint8 else FIVE
    if packed[1].dtype == torch.uint8:
        return SUPER
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
        return super_blocks(packed) or packed
    mirror = offsets == -7 * scales  # [O, G]
    if bool((mirror | (offsets == -8 * scales)).all()):
        groups = codes.view(codes.shape[0], scales.shape[1], -1)  # [O, G, group / 2]: a group's nibbles are contiguous
        codes = torch.where(mirror[..., None], groups ^ 0xFF, groups).view(codes.shape)  # 15 - q in both nibbles
        return codes, torch.where(mirror, -scales, scales).half(), torch.empty((offsets.shape[0], 0), dtype=torch.float16)
    low = offsets.half()
    return (codes, half, low) if torch.equal(low.float(), offsets) else super_blocks(packed) or packed


def super_blocks(packed: Packed) -> Packed | None:
    """packed in the SUPER form (4.75 bits a weight, from 6), where its groups are 32 inputs, 8 to a super-block, and
    every super-block's scales and offsets are one unit times bytes exactly (``sub_scales.factor``: a Q4_K's); else
    None."""
    codes, scales, offsets = packed
    out_features, groups = scales.shape
    if groups % SUPER_GROUPS or 2 * codes.shape[1] != 32 * groups:
        return None
    parts = [factor(t.reshape(-1, SUPER_GROUPS)) for t in (scales, offsets)]  # [O * G/8] units, [O * G/8, 8] bytes
    if None in parts:
        return None
    (ds, ks), (dm, km) = parts
    return (codes, torch.stack([ks.view(out_features, groups), km.view(out_features, groups)], -1),  # [O, G, 2]
            torch.stack([ds, dm], -1).view(out_features, groups // SUPER_GROUPS, 2))


def expanded(packed: Packed) -> Packed:
    """packed with fp32 scales and offsets, as ``pack`` gives them (what the fp32 and panel kernels read)."""
    codes, scales, offsets = packed
    if scales.dtype == torch.float32:
        return packed
    if offsets.dtype == torch.uint8:
        raise ValueError("5- and 6-bit codes have no 4-bit fp32 form: nibble_five / nibble_six.dequantize widen them")
    if scales.dtype == torch.uint8:
        units = offsets.repeat_interleave(SUPER_GROUPS, dim=1)  # [O, G, 2]
        wide = units * scales.float()  # exactly the products compact() took apart
        return codes, wide[..., 0].contiguous(), wide[..., 1].contiguous()
    wide = scales.float()
    return codes, wide, offsets.float() if offsets.numel() else -8 * wide


def check_form(x: torch.Tensor, packed: Packed, bias: torch.Tensor | None) -> None:
    """``check`` for any of the forms: fp16 scales with fp16 offsets of their shape, or with none ([O, 0])."""
    codes, scales, offsets = packed
    if scales.dtype == torch.uint8:
        groups = 2 * codes.shape[1] // 32
        if (scales.shape, offsets.shape, offsets.dtype) != ((codes.shape[0], groups, 2), (codes.shape[0], groups // SUPER_GROUPS, 2), torch.float32):
            raise ValueError(f"super-block scales {list(scales.shape)} and units {offsets.dtype} {list(offsets.shape)} do "
                             f"not describe groups of 32 in super-blocks of {SUPER_GROUPS}: use compact()")
    elif scales.dtype == torch.float16 and (offsets.dtype != torch.float16 or offsets.shape not in (scales.shape, (scales.shape[0], 0))):
        raise ValueError(f"fp16 scales {list(scales.shape)} need fp16 offsets of their shape or [O, 0], "
                         f"got {offsets.dtype} {list(offsets.shape)}: use compact()")
    check(x, expanded(packed), bias)
