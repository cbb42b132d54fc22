"""Pure tensor functions for integer group quantization. Imports only torch.

Codes are unsigned, q in [0, 2^bits), and every format dequantizes as w = (q - z) * s with one
scale s and zero point z per (output row, group of ``group_size`` input columns). Symmetric
quantization is the case z = 2^(bits-1) for every group (stored formats then omit z).
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class IntSpec:
    bits: int
    group_size: int  # input columns per scale; in_features for one scale per output row
    symmetric: bool = False

    def __post_init__(self):
        if self.bits not in (2, 3, 4, 5, 6, 8):
            raise ValueError(f"bits must be 2, 3, 4, 5, 6 or 8, got {self.bits}")
        if self.group_size <= 0:
            raise ValueError(f"group_size must be positive, got {self.group_size}")

    @property
    def qmax(self) -> int:
        return 2**self.bits - 1


DEFAULT_GROUP_SIZES = (128, 64, 32)


def default_group_size(widths: set[int], sizes: tuple[int, ...] = DEFAULT_GROUP_SIZES) -> int | None:
    """The first of ``sizes`` (128, else 64, else 32) that divides every in_features in ``widths``; None if none does."""
    return next((g for g in sizes if all(w % g == 0 for w in widths)), None)


def grouped(w: torch.Tensor, group_size: int) -> torch.Tensor:
    """[O, I] -> [O, I/g, g]."""
    out, inp = w.shape
    if inp % group_size:
        raise ValueError(f"in_features {inp} is not a multiple of group_size {group_size}")
    return w.reshape(out, inp // group_size, group_size)


def range_qparams(hi: torch.Tensor, lo: torch.Tensor, spec: IntSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [O, G] (fp32, int32) whose grid spans [lo, hi] [O, G] (symmetric: +-max|.|)."""
    if spec.symmetric:
        half = 2 ** (spec.bits - 1)
        scale = torch.maximum(hi.abs(), lo.abs()).clamp(min=1e-8) / (half - 1)
        return scale, torch.full_like(scale, half, dtype=torch.int32)
    hi, lo = hi.clamp(min=0), lo.clamp(max=0)  # the grid holds 0, so an all-positive group keeps its top
    scale = (hi - lo).clamp(min=1e-8) / spec.qmax
    return scale, torch.round(-lo / scale).clamp(0, spec.qmax).to(torch.int32)


def qparams(w: torch.Tensor, spec: IntSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """Scales and zero points [O, I/g] (fp32, int32) from the range of each group."""
    g = grouped(w.float(), spec.group_size)  # [O, G, g]
    return range_qparams(g.amax(-1), g.amin(-1), spec)


def quantize(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, spec: IntSpec) -> torch.Tensor:
    """[O, I] float -> [O, I] uint8 codes."""
    g = grouped(w.float(), spec.group_size)
    q = torch.round(g / scale[..., None]) + zero[..., None]
    return q.clamp(0, spec.qmax).to(torch.uint8).reshape(w.shape)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """[O, I] codes -> [O, I] in scale's dtype."""
    g = grouped(q, group_size).to(scale.dtype)
    return ((g - zero[..., None].to(scale.dtype)) * scale[..., None]).reshape(q.shape)


def pseudo_quantize(w: torch.Tensor, spec: IntSpec, params: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Round trip w -> codes -> w in w's dtype: what the model computes with after quantization.

    ``params`` (scale, zero) [O, I/g] replaces the ones from each group's range (a search's result).
    """
    scale, zero = params if params is not None else qparams(w, spec)
    return dequantize(quantize(w, scale, zero, spec), scale, zero, spec.group_size).to(w.dtype)


def nonzero(x: torch.Tensor) -> torch.Tensor:
    """x with its zeros replaced by 1: a divisor for the terms that are 0 anyway."""
    return torch.where(x == 0, 1.0, x)
