"""Rotary position embedding: inverse frequencies per rope_type, the cos/sin tables, and their application.

Types: default, linear, llama3 (Llama 3.1), yarn (Qwen's long-context setting), longrope (Phi-3/Phi-4:
short factors up to ``original_max_position_embeddings``, long ones past it). yarn and longrope scale
cos/sin by an attention factor. ``partial_rotary_factor`` < 1 rotates only the first dims of each head.

longrope chooses its factors by the length of the sequence at the step that computes a token: a
sequence longer than the original context uses the long factors for the tokens it computes from then
on. transformers' generate recomputes the whole cache when a sequence first crosses that length; our
engine, like vLLM, keeps the keys it cached before (a single forward of any length is identical).
"""

import math
from dataclasses import dataclass

import torch


@dataclass
class Rope:
    inv_freq: torch.Tensor  # [R/2] fp32, R = rotated dims of a head
    attention_factor: float = 1.0
    long_inv_freq: torch.Tensor | None = None  # longrope: used where the sequence is longer than ``original``
    original: int = 0

    def tables(self, positions: torch.Tensor, dtype: torch.dtype, lengths: torch.Tensor | None = None):
        """cos, sin [B, T, R] for positions [B, T]; ``lengths`` [B, T]: the length of each token's sequence at
        this step (longrope's choice), by default the row's largest position + 1."""
        inv = self.inv_freq.to(positions.device)
        if self.long_inv_freq is not None:
            if lengths is None:
                lengths = (positions.amax(-1, keepdim=True) + 1).expand_as(positions)
            long = (lengths > self.original)[..., None]  # [B, T, 1]
            inv = torch.where(long, self.long_inv_freq.to(positions.device), inv)  # [B, T, R/2]
        freqs = positions[..., None].float() * inv  # [B, T, R/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [B, T, R]
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype), sin.to(dtype)


def make_rope(params: dict, head_dim: int, max_positions: int) -> Rope:
    """A Rope from rope parameters ({"rope_type", "rope_theta", ...} as transformers normalizes them)."""
    dim = int(head_dim * (params.get("partial_rotary_factor") or 1.0))
    base = params["rope_theta"]
    pos = base ** (torch.arange(0, dim, 2, dtype=torch.int64, device="cpu").float() / dim)  # [R/2] wavelengths / 2 pi
    inv = 1.0 / pos
    kind = params.get("rope_type", "default")
    original = params.get("original_max_position_embeddings") or max_positions
    factor = params.get("factor") or max_positions / original
    if kind == "linear":
        return Rope(inv / params["factor"])
    if kind == "llama3":
        return Rope(llama3_scale(inv, params))
    if kind == "yarn":
        return Rope(*yarn(pos, dim, base, factor, original, params))
    if kind == "longrope":
        attention = params.get("attention_factor")
        if attention is None:
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        short = 1.0 / (torch.tensor(params["short_factor"], dtype=torch.float32) * pos)
        long = 1.0 / (torch.tensor(params["long_factor"], dtype=torch.float32) * pos)
        return Rope(short, attention, long, original)
    return Rope(inv)


def llama3_scale(inv: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the band between blended.
    old_ctx = s["original_max_position_embeddings"]
    low_wavelen = old_ctx / s["low_freq_factor"]
    high_wavelen = old_ctx / s["high_freq_factor"]
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / s["factor"], inv)
    smooth = (old_ctx / wavelen - s["low_freq_factor"]) / (s["high_freq_factor"] - s["low_freq_factor"])
    blended = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, blended, scaled)


def yarn(pos: torch.Tensor, dim: int, base: float, factor: float, original: int, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN: frequencies that turn fewer than beta_slow times over the original context are interpolated
    (divided by factor), those that turn more than beta_fast times kept, a linear ramp between; cos/sin
    scaled by 0.1 ln(factor) + 1 unless the config gives attention_factor (or DeepSeek's mscale pair)."""
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = s.get("attention_factor")
    if attention is None:
        m, m_all = s.get("mscale"), s.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(s.get("beta_fast") or 32), correction_dim(s.get("beta_slow") or 1)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)  # [R/2]
    keep = 1 - ramp  # 1: extrapolate (keep), 0: interpolate
    return 1.0 / (factor * pos) * (1 - keep) + 1.0 / pos * keep, float(attention)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, T, H, D]; cos/sin [B, T, R] broadcast over heads; R < D: the last D - R dims pass through
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    r = cos.shape[-1]
    if r == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    rot = x[..., :r]
    return torch.cat((rot * cos + rotate_half(rot) * sin, x[..., r:]), dim=-1)
