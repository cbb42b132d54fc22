"""LLM.int8 outlier split, calibrated: which input dims stay in floating point, and the int8 rest.

Dettmers et al. (2022) find outlier input dims at run time (|x| >= 6.0). Here they are found
once, from calibration statistics (max |x| per input dim of each Linear), and stored.
"""

from dataclasses import dataclass

import torch

INT8_MAX = 127


@dataclass(frozen=True)
class Int8Spec:
    outlier_threshold: float  # input dims whose calibration max |x| reaches this
    outlier_topk: int | None  # instead: the K dims with the largest max |x| (0 = no split)
    smooth_alpha: float = 0.0  # SmoothQuant migration strength on the norm-fed Linears (0 = none)
    act_group: int = 0  # x's int8 steps per token and block of this many inputs (0: one step per token)


def outlier_dims(absmax: torch.Tensor | None, spec: Int8Spec) -> torch.Tensor:
    """absmax [I] (max |x| per input dim over the calibration set) -> sorted int32 dims [k].

    ``absmax`` may be None only when ``spec`` asks for no outliers (top-0).
    """
    if spec.outlier_topk == 0:
        return torch.zeros(0, dtype=torch.int32)
    if spec.outlier_topk is not None:
        idx = absmax.float().topk(spec.outlier_topk).indices
    else:
        idx = torch.nonzero(absmax.float() >= spec.outlier_threshold).flatten()
    return idx.sort().values.to(torch.int32)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[O, I] float -> (int8 [O, I], scale [O, 1] in w's dtype): symmetric absmax per row."""
    scale = w.float().abs().amax(-1, keepdim=True).clamp(min=1e-8) / INT8_MAX  # [O, 1]
    q = torch.round(w.float() / scale).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale.to(w.dtype)


def split_weight(w: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[O, I] float, outlier dims [k] -> (int8 [O, I] with the outlier columns zero, row scale
    [O, 1], outlier columns fp16 [O, k]). The row scales see only the non-outlier columns."""
    cols = idx.long()
    rest = w.index_fill(1, cols, 0)  # [O, I]
    q, scale = quantize_rows(rest)
    return q, scale, w[:, cols].half()
