"""llama.cpp's GGUF block types as pure tensor functions: the grids each type can store, codes on them, and the
exact ggml bytes. Imports only torch (the K-quants' sub-scales and layouts are in gguf_kquants.py, our weight-only
grid search in gguf_search.py).

A weight W [O, I] (rows = output features) is stored row by row; a row of I weights is I/block blocks back to
back, each ``type_size`` bytes, little-endian, fp16 as IEEE half. Per type (q = ggml's code of one weight):

* Q4_0  block 32, 18 bytes: [0:2] fp16 d, [2:18] nibbles; byte 2+j = q[j] | q[j+16] << 4.  w = d*(q - 8).
* Q4_1  block 32, 20 bytes: [0:2] fp16 d, [2:4] fp16 m, [4:20] nibbles as Q4_0.  w = d*q + m.
* Q5_0  block 32, 22 bytes: [0:2] fp16 d, [2:6] qh: uint32 whose bit j is bit 4 of q[j], [6:22] the low nibbles
  as Q4_0.  w = d*(q - 16).
* Q8_0  block 32, 34 bytes: [0:2] fp16 d, [2:34] int8 q[j] - 128.  w = d*(q - 128).
* Q4_K  super-block 256 = 8 sub-blocks of 32, 144 bytes: [0:2] fp16 d, [2:4] fp16 dmin, [4:16] the 6-bit
  sub-scales sc[8] and mins m[8] (llama.cpp's get_scale_min_k4): for j < 4, byte 4+j = sc[j] | (sc[j+4] >> 4) << 6,
  byte 8+j = m[j] | (m[j+4] >> 4) << 6, byte 12+j = (sc[j+4] & 15) | (m[j+4] & 15) << 4; [16:144] nibbles by
  chunks of 64 weights: byte 16 + 32c + l = q[64c + l] | q[64c + 32 + l] << 4.  w = d*sc[j]*q - dmin*m[j].
* Q6_K  super-block 256 = 16 groups of 16, 210 bytes: [0:128] ql, [128:192] qh, [192:208] int8 sc[16] (group j =
  weights 16j..16j+15), [208:210] fp16 d (last). For each half h of 128 weights and l < 32, with
  q_k = q[128h + 32k + l]: ql[64h + l] = (q_0 & 15) | (q_2 & 15) << 4, ql[64h + 32 + l] = (q_1 & 15) | (q_3 & 15) << 4,
  qh[32h + l] = q_0 >> 4 | (q_1 >> 4) << 2 | (q_2 >> 4) << 4 | (q_3 >> 4) << 6.  w = d*sc[j]*(q - 32).

Our side of it: codes are unsigned uint8 [O, I] (as compress.quant.primitives and gptq) and every group of
``group`` weights of a row has one grid w = q*a + b with a >= 0 (``Grid``, shapes [O, I/group]). The stored scale
of a group (d, d*sc) may be negative: then our code is 2^bits-1 minus ggml's, so that a = |scale| and GPTQ's
positive-scale rounding applies to every type. q*a + b in fp32 equals ggml's dequantization bit for bit (the
products are exact in fp32), except where a Q4_1 or Q4_K scale is negative (b then rounds), which llama.cpp's
quantizers and ours never write.
"""

from dataclasses import dataclass

import torch

from compress.quant.gguf_kquants import (QK_K, bytes_half, half_bytes, pack_q4_k, pack_q6_k, subscales, unpack_q4_k,
                                        unpack_q6_k)
from compress.quant.primitives import nonzero


@dataclass(frozen=True)
class BlockType:
    """What a GGUF block type is, as data (the byte layouts are in the module docstring)."""

    name: str
    ggml: int  # gguf.GGMLQuantizationType value
    block: int  # weights per stored block
    group: int  # weights sharing one (a, b)
    bits: int
    type_size: int  # bytes per block
    symmetric: bool  # w = s*(q - 2^(bits-1)) for the group's signed scale s
    nonpositive_offset: bool = False  # b <= 0 always (Q4_K stores -b as an unsigned 6-bit min)

    @property
    def qmax(self) -> int:
        return 2**self.bits - 1

    @property
    def half(self) -> int:
        return 2 ** (self.bits - 1)

    @property
    def under_a_byte(self) -> bool:
        """Fewer bytes a weight than int8 rows (a byte a weight): an output layer of this type (Q6_K, 4/5-bit) runs as
        its codes on the CPU, a Q8_0 one (a byte and a scale per 32) as int8 rows (runtime/cpu_linears.py)."""
        return self.type_size < self.block

    @property
    def subscaled(self) -> bool:
        """A K-quant: each group's scale is the block's d times the group's own integer sub-scale."""
        return self.block > self.group


TYPES = {t.name: t for t in (
    BlockType("Q4_0", 2, 32, 32, 4, 18, True),
    BlockType("Q4_1", 3, 32, 32, 4, 20, False),
    BlockType("Q5_0", 6, 32, 32, 5, 22, True),
    BlockType("Q8_0", 8, 32, 32, 8, 34, True),
    BlockType("Q4_K", 12, QK_K, 32, 4, 144, False, nonpositive_offset=True),
    BlockType("Q6_K", 14, QK_K, 16, 6, 210, True),
)}


@dataclass
class Grid:
    a: torch.Tensor  # [O, I/group] fp32 step, >= 0, after the type's own rounding of its scales
    b: torch.Tensor  # [O, I/group] fp32 offset: w = q*a + b
    # The type's own numbers, for pack(): d (, dmin) [O, I/block] fp16; Q4_1's m [O, I/32] fp16; the K-quants'
    # sub-scales sc [O, I/group] (Q4_K uint8 < 64, Q6_K int8) and Q4_K's mins m [O, I/32] uint8 < 64.
    stored: dict[str, torch.Tensor]


def check_width(t: BlockType, in_features: int) -> None:
    if in_features % t.block:
        raise ValueError(f"{t.name} stores rows in blocks of {t.block} weights; in_features {in_features} is not a "
                         f"multiple of {t.block}")


def fit_grid(t: BlockType, step: torch.Tensor, offset: torch.Tensor) -> Grid:
    """The grid of type t nearest to the wanted grids w = q*step + offset [O, I/t.group] (a grid the type holds
    comes back exactly). Symmetric types keep the step and choose the scale's sign whose offset is nearer."""
    check_width(t, step.shape[1] * t.group)
    step, offset = step.float(), offset.float()
    a, b = step.abs(), torch.where(step < 0, offset + step * t.qmax, offset)  # the same grid, walked upwards
    return grid_of(t, stored_numbers(t, a, b, None, None))


def nearest_codes(t: BlockType, w: torch.Tensor, grid: Grid) -> torch.Tensor:
    """uint8 [O, I]: q = clamp(round((w - b)/a), 0, 2^bits - 1); where a = 0 (every code gives b), the zero point
    (2^(bits-1) symmetric, else 0) as ggml's reference quantizers write it."""
    x = grouped(t, w.float())
    a, b = grid.a[..., None], grid.b[..., None]
    q = torch.round((x - b) / nonzero(a)).clamp(0, t.qmax)
    q = torch.where(a == 0, float(t.half if t.symmetric else 0), q)
    return q.to(torch.uint8).reshape(w.shape)


def pack(t: BlockType, codes: torch.Tensor, grid: Grid) -> torch.Tensor:
    """uint8 [O, I/block*type_size]: the ggml bytes of each row of codes [O, I] on ``grid``."""
    out, inp = codes.shape
    check_width(t, inp)
    native = _flip(t, codes, grid.stored).reshape(out, inp // t.block, t.block)
    stored = {k: v.reshape(out, inp // t.block, -1).squeeze(-1) for k, v in grid.stored.items()}
    if t.name == "Q4_K":
        raw = pack_q4_k(native, stored["d"], stored["dmin"], stored["sc"], stored["m"])
    elif t.name == "Q6_K":
        raw = pack_q6_k(native, stored["d"], stored["sc"])
    else:
        raw = _pack_legacy(t, native, stored)
    return raw.reshape(out, -1)


def _unpack_native(t: BlockType, raw: torch.Tensor, in_features: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(ggml's own codes uint8 [O, I], the stored numbers [O, ...]) of ggml bytes raw [O, I/block*type_size]."""
    check_width(t, in_features)
    out = raw.shape[0]
    blocks = raw.reshape(out, in_features // t.block, t.type_size)
    if t.name == "Q4_K":
        native, stored = unpack_q4_k(blocks)
    elif t.name == "Q6_K":
        native, stored = unpack_q6_k(blocks)
    else:
        native, stored = _unpack_legacy(t, blocks)
    return native.reshape(out, in_features), {k: v.reshape(out, -1) for k, v in stored.items()}


def unpack(t: BlockType, raw: torch.Tensor, in_features: int) -> tuple[torch.Tensor, Grid]:
    """(codes uint8 [O, I], Grid) from the rows of ggml bytes raw [O, I/block*type_size]; inverse of ``pack``."""
    native, stored = _unpack_native(t, raw, in_features)
    return _flip(t, native, stored), grid_of(t, stored)


def native(t: BlockType, raw: torch.Tensor, in_features: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """ggml's own numbers of raw (as ``unpack``): (codes [O, I], s [O, G], o [O, G]) with w = s*codes + o exactly,
    s of either sign. Symmetric types give int8 codes q - 2^(bits-1) and o None (w = s*codes), the others uint8."""
    codes, stored = _unpack_native(t, raw, in_features)
    s, o = _signed_affine(t, stored)
    if t.symmetric:
        return (codes.to(torch.int16) - t.half).to(torch.int8), s, None
    return codes, s, o


def dequantize(t: BlockType, raw: torch.Tensor, in_features: int) -> torch.Tensor:
    """fp32 [O, I] from ggml bytes [O, I/block*type_size]: q*a + b, equal to ggml's bit for bit."""
    codes, grid = unpack(t, raw, in_features)
    x = grouped(t, codes.float())
    return (x * grid.a[..., None] + grid.b[..., None]).reshape(codes.shape)


def grid_of(t: BlockType, stored: dict[str, torch.Tensor]) -> Grid:
    """The Grid that the stored numbers of type t give."""
    a, b = upward(*_signed_affine(t, stored), t.qmax)
    return Grid(a, b, stored)


def _signed_affine(t: BlockType, stored: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, o) [O, G] fp32 with w = s*q + o for ggml's codes q."""
    per = t.block // t.group  # groups per stored d
    s = stored["d"].float().repeat_interleave(per, 1)
    if t.subscaled:
        s = s * stored["sc"].float()
    if t.symmetric:
        return s, -t.half * s
    if t.subscaled:
        return s, -(stored["dmin"].float().repeat_interleave(per, 1) * stored["m"].float())
    return s, stored["m"].float()


def upward(s: torch.Tensor, o: torch.Tensor, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) >= 0 step of the grid s*q + o, q in [0, qmax]: a negative s walks it from its other end."""
    return s.abs(), torch.where(s < 0, o + s * qmax, o)


def _flip(t: BlockType, codes: torch.Tensor, stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """ggml's codes <-> ours (the map is its own inverse): reversed where the group's stored scale is negative."""
    s = _signed_affine(t, stored)[0]  # [O, G]
    neg = (s < 0).repeat_interleave(t.group, 1)  # [O, I]
    return torch.where(neg, t.qmax - codes, codes).to(torch.uint8)


def stored_numbers(t: BlockType, a, b, sa, sb, nearest: int | None = None) -> dict[str, torch.Tensor]:
    """The numbers type t stores for the grids (a, b) [O, G]; sa, sb [O, G] weigh the error of a step and of an
    offset where sub-scales are rounded (None: alike); ``nearest``: see gguf_kquants.subscales."""
    if t.symmetric:  # the scale's sign chooses which end gets the extra level
        r = b / nonzero(a)
        s = torch.where((r + t.half).abs() <= (r + t.half - 1).abs(), a, -a)
        if t.subscaled:  # Q6_K: int8 sub-scales
            d, sc = _subscales(t, s, -128, 127, sa, nearest)
            return {"d": d, "sc": sc.to(torch.int8)}
        return {"d": s.half()}
    if t.subscaled:  # Q4_K: 6-bit sub-scales and mins
        d, sc = _subscales(t, a, 0, 63, sa, nearest)
        dmin, m = _subscales(t, (-b).clamp(min=0), 0, 63, sb, nearest)
        return {"d": d, "dmin": dmin, "sc": sc.to(torch.uint8), "m": m.to(torch.uint8)}
    return {"d": a.half(), "m": b.half()}


def _subscales(t: BlockType, x: torch.Tensor, lo: int, hi: int, weight: torch.Tensor | None, nearest: int | None):
    """(d [O, S] fp16, levels [O, G] int32): ``subscales`` of x [O, G] per super-block."""
    out, per = x.shape[0], t.block // t.group
    weight = None if weight is None else weight.reshape(out, -1, per)
    d, levels = subscales(x.reshape(out, -1, per), lo, hi, weight, nearest)
    return d, levels.reshape(out, -1)


def _pack_legacy(t: BlockType, q: torch.Tensor, stored: dict[str, torch.Tensor]) -> torch.Tensor:
    """Blocks [O, n, type_size] of Q4_0, Q4_1, Q5_0, Q8_0 from ggml's codes q [O, n, 32] and d (, m) [O, n]."""
    head = [half_bytes(stored[k]) for k in ("d", "m") if k in stored]
    if t.bits == 8:
        return torch.cat(head + [q ^ 0x80], -1)  # the int8 q - 128 has q's bits with the top one flipped
    nibbles = (q[..., :16] & 15) | (q[..., 16:] & 15) << 4
    if t.bits == 5:
        bits = (q >> 4).reshape(*q.shape[:-1], 4, 8).int() << torch.arange(8, device=q.device)
        head.append(bits.sum(-1).to(torch.uint8))  # qh: bit j of the little-endian uint32 is bit 4 of q[j]
    return torch.cat(head + [nibbles], -1)


def _unpack_legacy(t: BlockType, raw: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inverse of ``_pack_legacy``: (q [O, n, 32], {d (, m) [O, n] fp16}) from [O, n, type_size]."""
    keys = ("d",) if t.symmetric else ("d", "m")
    stored = {k: bytes_half(raw[..., 2 * i : 2 * i + 2]) for i, k in enumerate(keys)}
    body = raw[..., 2 * len(keys) :]
    if t.bits == 8:
        return body ^ 0x80, stored
    q = torch.cat([body[..., -16:] & 15, body[..., -16:] >> 4], -1)
    if t.bits == 5:
        high = (body[..., :4, None] >> torch.arange(8, dtype=torch.uint8, device=raw.device)) & 1  # [O, n, 4, 8]
        q = q | high.flatten(-2) << 4
    return q, stored


def grouped(t: BlockType, w: torch.Tensor) -> torch.Tensor:
    """[O, I] -> [O, I/group, group]."""
    check_width(t, w.shape[1])
    return w.reshape(w.shape[0], -1, t.group)
