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
