"""fp8 e4m3 weights with one scale per output channel (FP8_DYNAMIC in llm-compressor's terms).

Rounding is torch's float8_e4m3fn cast (round to nearest even), after saturating to +-448:
the values are real e4m3 numbers, not a float16 imitation.
"""

from dataclasses import dataclass

import torch

from compress.errors import UserError

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass(frozen=True)
class Fp8Spec:
    static_activations: bool = False  # True: one calibrated input scale per Linear; False: per token at run time


def require_float8() -> None:
    """One clear error on a torch that has no float8 dtypes."""
    if not hasattr(torch, "float8_e4m3fn"):
        raise UserError(f"--method fp8 needs a torch with float8 dtypes (2.1 or newer); this is torch {torch.__version__}")


def to_e4m3(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x / scale saturated to +-448 and cast to float8_e4m3fn (scale broadcasts against x)."""
    return (x.float() / scale.float()).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def channel_scale(w: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
    """Scale [O, 1] in w's dtype for w [O, I]: absmax / 448 of each row, times ``factor`` (below 1: the row's
    largest weights saturate at +-448, and the grid's steps fall elsewhere on the rest)."""
    return (w.float().abs().amax(-1, keepdim=True) * factor / FP8_MAX).clamp(min=1e-12).to(w.dtype)


def quantize_weight(w: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[O, I] float -> (float8_e4m3fn [O, I], scale [O, 1] in w's dtype) by nearest rounding; scale = absmax / 448
    unless given."""
    scale = channel_scale(w) if scale is None else scale  # [O, 1]
    return to_e4m3(w, scale), scale


def snap(target: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the nearest e4m3 value of target / scale, that value times scale), fp32 like target and scale (same shape)."""
    q = to_e4m3(target, scale).float()
    return q, q * scale


def input_scale(absmax: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Static per-tensor input scale [1] from the calibration max |x| per input dim [I]."""
    return (absmax.float().max() / FP8_MAX).clamp(min=1e-12).reshape(1).to(dtype)
