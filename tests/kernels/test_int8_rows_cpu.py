"""The int8-per-row CPU GEMM against torch on the weight its codes stand for, in each x86 build."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.int8_rows_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 4, 5, 13])  # whole and partial row tiles
@pytest.mark.parametrize("shape", [(36, 96), (29, 100)])  # whole tiles and vectors; ragged tiles and a tail of inputs
def test_matches_torch_on_the_dequantized_weight(isa, rows, shape):
    g = torch.Generator().manual_seed(rows)
    w, x, b = torch.randn(*shape, generator=g), torch.randn(rows, 1, shape[1], generator=g), torch.randn(shape[0], generator=g)
    packed = kernel.quantize(w, rows=7)  # several slices of rows
    assert_matches(kernel.linear(x, packed, b), F.linear(x, kernel.dequantize(packed), b))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 6, 13, 64])  # partial and whole micro-tiles of the panel GEMM
def test_the_panel_gemm_matches_torch_on_the_dequantized_weight(isa, rows):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(29, 600, generator=g), torch.randn(rows, 600, generator=g)
    packed = kernel.quantize(w)
    assert_matches(kernel.panel(x, packed), F.linear(x, kernel.dequantize(packed)))


def test_quantize_is_symmetric_per_row_within_half_a_step():
    w = torch.randn(50, 64) * torch.logspace(-3, 1, 50)[:, None]  # rows of very different ranges
    w[3] = 0  # a zero row: scale 0, codes 0
    codes, scale = kernel.quantize(w.bfloat16())
    assert codes.dtype == torch.int8 and codes.abs().max() == 127 and scale[3] == 0
    err = (kernel.dequantize((codes, scale)) - w.bfloat16().float()).abs()
    assert (err <= scale[:, None] * 0.5001).all()  # half a step, and fp32's rounding of the quotient
    out = torch.full((60 * 64,), float("nan"))
    assert torch.equal(kernel.dequantize((codes, scale), out), kernel.dequantize((codes, scale)))


@needs_kernel
def test_bad_operands_are_refused():
    packed = kernel.quantize(torch.randn(8, 32))
    with pytest.raises(ValueError, match="ending in 32 features"):
        kernel.linear(torch.randn(1, 16), packed)
    with pytest.raises(ValueError, match="int8 codes"):
        kernel.linear(torch.randn(1, 32), (packed[0].float(), packed[1]))
