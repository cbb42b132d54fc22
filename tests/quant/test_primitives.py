import pytest
import torch

from compress.quant.primitives import IntSpec, dequantize, pseudo_quantize, qparams, quantize, range_qparams


@pytest.mark.parametrize("bits", [3, 4, 8])
@pytest.mark.parametrize("group_size", [16, 64, 96])
@pytest.mark.parametrize("symmetric", [False, True])
def test_error_bounded_by_half_a_step(bits, group_size, symmetric):
    w = torch.randn(12, 192) * torch.rand(12, 1) * 3
    spec = IntSpec(bits, group_size, symmetric)
    scale, zero = qparams(w, spec)
    q = quantize(w, scale, zero, spec)
    assert q.max() <= spec.qmax
    err = (dequantize(q, scale, zero, group_size) - w).view(12, -1, group_size).abs()
    bound = scale[..., None] / 2 + 1e-6
    if symmetric:  # the most negative value may sit one step below the grid's mirror image
        bound = bound * 2
    assert (err <= bound).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_one_signed_group_stays_on_the_grid(sign):
    w = sign * (torch.rand(3, 16) + 1.0)  # every weight in [1, 2): the range must still reach them
    spec = IntSpec(4, 16)
    assert (pseudo_quantize(w, spec) - w).abs().max() <= 2.0 / 15 / 2 + 1e-6


def test_per_channel_is_one_group():
    w = torch.randn(4, 40)
    spec = IntSpec(4, 40)
    scale, zero = qparams(w, spec)
    assert scale.shape == (4, 1)


def test_a_narrower_range_is_respected():
    w = torch.tensor([[-4.0, -1.0, 0.5, 4.0]])
    spec = IntSpec(4, 4)
    out = pseudo_quantize(w, spec, range_qparams(torch.tensor([[1.0]]), torch.tensor([[-1.0]]), spec))
    half_step = 2.0 / 15 / 2  # the zero point rounds to the grid, shifting the range by up to half a step
    assert out.abs().max() <= 1.0 + half_step + 1e-6
    assert (out - pseudo_quantize(w, spec)).abs().max() > 1.0  # without the narrower range, +-4 survive


def test_symmetric_range_is_the_larger_side():
    spec = IntSpec(4, 4, symmetric=True)
    scale, zero = range_qparams(torch.tensor([[0.5]]), torch.tensor([[-7.0]]), spec)
    assert scale.item() == pytest.approx(1.0) and zero.item() == 8


def test_bad_spec():
    with pytest.raises(ValueError):
        IntSpec(7, 64)  # 5 and 6 are GGUF widths (Q5_0, Q6_K)
    with pytest.raises(ValueError, match="not a multiple"):
        qparams(torch.randn(2, 10), IntSpec(4, 4))
