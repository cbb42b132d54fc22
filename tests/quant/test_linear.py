"""PackedLinear: the codes it stores are the ones rounding gave, and they dequantize to its weight."""

import pytest
import torch
from torch import nn

from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec, qparams, quantize


@pytest.mark.parametrize("bits,symmetric", [(4, False), (3, False), (4, True), (3, True)])
def test_codes_are_the_rounded_weight_and_dequantize_to_it(bits, symmetric):
    torch.manual_seed(bits)
    lin = nn.Linear(64, 24, bias=False)
    spec = IntSpec(bits, 16, symmetric)
    packed = PackedLinear.from_float(lin, spec)
    codes, scale, zero = packed.codes()
    want_scale, want_zero = qparams(lin.weight.detach(), spec)
    assert torch.equal(codes, quantize(lin.weight.detach(), want_scale, want_zero, spec))
    assert torch.equal(zero, want_zero) and zero.dtype == torch.int32
    assert torch.equal(scale, want_scale)
    weight = (codes.view(24, 4, 16).float() - zero[..., None]) * scale[..., None]
    torch.testing.assert_close(weight.view(24, 64), packed.dequantized(), rtol=0, atol=0)
