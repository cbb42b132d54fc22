"""GPTQ's rounding: nearest rounding when inputs are uncorrelated, a smaller output error when they are not."""

import pytest
import torch

from compress.quant.gptq import gptq_codes
from compress.quant.primitives import IntSpec, grouped, qparams, quantize

SPEC = IntSpec(4, 16)


def correlated_inputs(n=4096, dim=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=g) / dim**0.5 + torch.eye(dim)
    return torch.randn(n, dim, generator=g) @ mix  # [n, dim], channels share most of their variance


def output_error(w, codes, scale, zero, x):
    """Mean squared error of x W^T when W is replaced by its rounding."""
    q = (grouped(codes.float(), SPEC.group_size) - zero[..., None].float()) * scale[..., None]
    return (x @ (w - q.reshape(w.shape)).T).pow(2).mean().item()


def test_uncorrelated_inputs_give_nearest_rounding():
    w = torch.randn(32, 64)
    scale, zero = qparams(w, SPEC)
    assert torch.equal(gptq_codes(w, torch.eye(64), scale, zero, SPEC), quantize(w, scale, zero, SPEC))


@pytest.mark.parametrize("bits", [3, 4])
def test_error_feedback_beats_nearest_on_correlated_inputs(bits):
    spec = IntSpec(bits, SPEC.group_size)
    w, x = torch.randn(48, 64, generator=torch.Generator().manual_seed(1)), correlated_inputs()
    scale, zero = qparams(w, spec)
    codes = gptq_codes(w, x.T @ x / x.shape[0], scale, zero, spec)
    assert codes.dtype == torch.uint8 and codes.max() <= spec.qmax
    nearest = quantize(w, scale, zero, spec)
    assert output_error(w, codes, scale, zero, x) < 0.75 * output_error(w, nearest, scale, zero, x)


def test_block_size_does_not_change_the_codes():
    w, x = torch.randn(16, 64), correlated_inputs(seed=2)
    scale, zero = qparams(w, SPEC)
    h = x.T @ x / x.shape[0]
    a, b = gptq_codes(w, h, scale, zero, SPEC, block=128), gptq_codes(w, h, scale, zero, SPEC, block=16)
    assert (a == b).float().mean() > 0.99  # the same algebra; float sums in another order may flip a tie


def test_inputs_that_are_always_zero_give_nearest_rounding():
    w = torch.randn(16, 64)
    scale, zero = qparams(w, SPEC)
    assert torch.equal(gptq_codes(w, torch.zeros(64, 64), scale, zero, SPEC), quantize(w, scale, zero, SPEC))


def test_act_order_rounds_the_loudest_inputs_first_on_the_original_grids():
    # Input energy rising with the column index: act-order is GPTQ over the columns in reverse order,
    # each column still on its own group's grid.
    w, x = torch.randn(16, 64), correlated_inputs(seed=3)
    x = x * (torch.linspace(1, 3, 64) / x.pow(2).mean(0)).sqrt()  # E[x_i^2] = 1 + 2i/63
    scale, zero = qparams(w, SPEC)
    h = x.T @ x / x.shape[0]
    ordered = gptq_codes(w, h, scale, zero, SPEC, act_order=True)
    reverse = gptq_codes(w.flip(1), h.flip(0, 1), scale.flip(1), zero.flip(1), SPEC, act_order=False).flip(1)
    assert torch.equal(ordered, reverse)
    assert not torch.equal(ordered, gptq_codes(w, h, scale, zero, SPEC, act_order=False))
