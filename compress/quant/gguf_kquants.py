"""llama.cpp's K-quant super-blocks (Q4_K, Q6_K): their quantized sub-scales and byte layouts. Imports only torch
and primitives.

The layouts are specified in compress/quant/gguf_blocks.py's docstring, which is the public entry point; this file
holds what only the 256-weight super-blocks need. Tensors are per super-block: [O, S, ...] for S = I/256 of each row.
Codes here are ggml's own ("native": w = s*q + o with the signed per-group scale s that the stored numbers give).
"""

import torch

from compress.quant.primitives import nonzero

QK_K = 256


def half_bytes(x: torch.Tensor) -> torch.Tensor:
    """[...] -> [..., 2] uint8: x as little-endian fp16."""
    return x.to(torch.float16).contiguous().unsqueeze(-1).view(torch.uint8)


def bytes_half(b: torch.Tensor) -> torch.Tensor:
    """[..., 2] uint8 -> [...] fp16; inverse of ``half_bytes``."""
    return b.contiguous().view(torch.float16).squeeze(-1)


def subscales(x: torch.Tensor, lo: int, hi: int, weight: torch.Tensor | None = None, nearest: int | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(d fp16 [...], L [..., n] int32 in [lo, hi]) with x [..., n] ~ d * L per super-block, the smallest
    sum weight * (x - d L)^2 among d = +-max|x| / k for every k (so that x already of that form is met exactly;
    ``nearest``: only the k that many below the top level, which win nearly always and cost a fraction of it),
    then one least-squares step for d. llama.cpp's reference takes max/63 (Q4_K) or max/-128 (Q6_K) alone."""
    weight = torch.ones_like(x) if weight is None else weight
    amax = x.abs().amax(-1)  # [...]
    best = (torch.full_like(amax, torch.inf), torch.zeros_like(amax))  # (error, d)
    top = max(hi, -lo)
    for sign in (1, -1) if lo < 0 else (1,):
        for k in range(1 if nearest is None else max(1, top - nearest + 1), top + 1):
            _try_scale(x, sign * amax / k, lo, hi, weight, best)
    levels = _levels(x, best[1], lo, hi)
    ls = (weight * x * levels).sum(-1) / (weight * levels * levels).sum(-1).clamp(min=1e-30)
    _try_scale(x, ls, lo, hi, weight, best)
    d = best[1].half()
    return d, _levels(x, d.float(), lo, hi).int()


def _levels(x: torch.Tensor, d: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    return torch.round(x / nonzero(d)[..., None]).clamp(lo, hi)  # d = 0: every level gives 0


def _try_scale(x, d, lo, hi, weight, best) -> None:
    """Keep d [...] (rounded to fp16) in ``best`` where its error is smaller."""
    d = d.half().float()
    levels = _levels(x, d, lo, hi)
    err = (weight * (x - d[..., None] * levels) ** 2).sum(-1)
    better = err < best[0]
    torch.where(better, err, best[0], out=best[0])
    torch.where(better, d, best[1], out=best[1])


def pack_q4_k(q: torch.Tensor, d: torch.Tensor, dmin: torch.Tensor, sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Q4_K blocks [O, S, 144] from native codes q [O, S, 256], d, dmin [O, S] fp16, sc, m [O, S, 8] uint8 (< 64)."""
    lo, hi = (sc[..., :4], m[..., :4]), (sc[..., 4:], m[..., 4:])
    scales = torch.cat([lo[0] | (hi[0] >> 4) << 6, lo[1] | (hi[1] >> 4) << 6, (hi[0] & 15) | (hi[1] & 15) << 4], -1)
    qs = q.reshape(*q.shape[:-1], 4, 2, 32)  # 64 weights a chunk: 32 in the low nibbles, the next 32 in the high
    qs = (qs[..., 0, :] | qs[..., 1, :] << 4).flatten(-2)  # [O, S, 128]
    return torch.cat([half_bytes(d), half_bytes(dmin), scales, qs], -1)


def unpack_q4_k(raw: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inverse of ``pack_q4_k``: (q [O, S, 256], {d, dmin [O, S] fp16, sc, m [O, S, 8] uint8}) from [O, S, 144]."""
    s = raw[..., 4:16]  # get_scale_min_k4's 12 bytes
    sc = torch.cat([s[..., 0:4] & 63, (s[..., 8:12] & 15) | (s[..., 0:4] >> 6) << 4], -1)
    m = torch.cat([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | (s[..., 4:8] >> 6) << 4], -1)
    qs = raw[..., 16:].reshape(*raw.shape[:-1], 4, 1, 32)
    q = torch.cat([qs & 15, qs >> 4], -2).flatten(-3)
    return q, {"d": bytes_half(raw[..., 0:2]), "dmin": bytes_half(raw[..., 2:4]), "sc": sc, "m": m}


def pack_q6_k(q: torch.Tensor, d: torch.Tensor, sc: torch.Tensor) -> torch.Tensor:
    """Q6_K blocks [O, S, 210] from native codes q [O, S, 256] (< 64), d [O, S] fp16, sc [O, S, 16] int8."""
    q = q.reshape(*q.shape[:-1], 2, 4, 32)  # [O, S, half, quarter, 32]: weight 128*half + 32*quarter + l
    low, high = q & 15, q >> 4
    ql = (low[..., 0:2, :] | low[..., 2:4, :] << 4).flatten(-3)  # [O, S, 128]: quarters 0, 1 low, 2, 3 high nibbles
    qh = high[..., 0, :] | high[..., 1, :] << 2 | high[..., 2, :] << 4 | high[..., 3, :] << 6
    qh = qh.flatten(-2)  # [O, S, 64]
    return torch.cat([ql, qh, sc.view(torch.uint8), half_bytes(d)], -1)


def unpack_q6_k(raw: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Inverse of ``pack_q6_k``: (q [O, S, 256], {d [O, S] fp16, sc [O, S, 16] int8}) from [O, S, 210]."""
    ql = raw[..., :128].reshape(*raw.shape[:-1], 2, 1, 2, 32)  # [O, S, half, 1, quarter % 2, 32]
    qh = raw[..., 128:192].reshape(*raw.shape[:-1], 2, 1, 32)
    low = torch.cat([ql & 15, ql >> 4], -3).flatten(-3, -2)  # [O, S, half, quarter, 32]
    high = torch.stack([(qh[..., 0, :] >> s) & 3 for s in (0, 2, 4, 6)], -2)  # [O, S, half, quarter, 32]
    q = (low | high << 4).flatten(-3)
    return q, {"d": bytes_half(raw[..., 208:210]), "sc": raw[..., 192:208].contiguous().view(torch.int8)}
