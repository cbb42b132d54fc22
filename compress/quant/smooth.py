"""SmoothQuant migration (Xiao et al., ICML 2023) for int8 activations. Returns numbers only.

Per-token int8 rounds every input dim of a token with the step of its largest dim, so a few
channels with large |x| make the others coarse. Dividing input channel j by
    s_j = max|x_j|^alpha / max|W[:, j]|^(1 - alpha)
and multiplying W's column j by it leaves x @ W^T unchanged while moving range from the
activations (hard to quantize per token) to the weights (quantized per row, easy).
The fold into the preceding RMSNorm happens in ``static_apply.py``.
"""

import torch

MIN_STAT = 1e-5  # dims never seen active (or all-zero columns) get s = 1-ish, not inf


def smooth_scales(x_absmax: torch.Tensor, w_absmax: torch.Tensor, alpha: float) -> torch.Tensor:
    """x_absmax [C] (calibration max |x| per input dim), w_absmax [C] (max |W| per column over
    the Linears sharing the input) -> s [C]: divide the input by s, multiply W's columns by s."""
    x = x_absmax.float().clamp(min=MIN_STAT)
    w = w_absmax.float().clamp(min=MIN_STAT)
    return (x.pow(alpha) / w.pow(1 - alpha)).clamp(min=MIN_STAT)
