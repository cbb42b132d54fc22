"""SmoothQuant's migration scales."""

import torch

from compress.quant.smooth import smooth_scales


def test_scales_balance_activation_and_weight_ranges():
    x = torch.tensor([4.0, 1.0, 9.0])
    w = torch.tensor([1.0, 4.0, 1.0])
    s = smooth_scales(x, w, 0.5)
    assert torch.allclose(s, torch.tensor([2.0, 0.5, 3.0]))
    assert torch.allclose(x / s, w * s)  # alpha 0.5: both sides end with the same range
    assert torch.allclose(smooth_scales(x, w, 0.0), 1 / w)
    assert torch.allclose(smooth_scales(x, w, 1.0), x)


def test_dead_channels_get_finite_scales():
    s = smooth_scales(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]), 0.5)
    assert torch.isfinite(s).all() and (s > 0).all()
