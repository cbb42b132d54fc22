"""The 4-bit CPU GEMM on int8 activations against the reference's emulation of its arithmetic, in each x86 build,
and against the exact fp32 product within what rounding x to 8 bits explains."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant import packing
from tests.kernels.test_nibble_linear_cpu import random_weight, reference_linear
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.nibble_q8_cpu")
nibbles = importlib.import_module("compress.kernels.nibble_linear_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler or no AVX2 for the kernel here")


def emulated(x, codes, scale, zero, bits, bias=None):
    return reference.int8_activation_matmul(x, packing.pack(codes, bits), scale, packing.pack_zero_points(zero, bits), bits, bias)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13])  # whole and partial 4-row tiles
@pytest.mark.parametrize("out_features", [36, 29])  # whole 4- and 2-row tiles, and a ragged last one
@pytest.mark.parametrize("group", [32, 64, 128])  # 32: a different scale in each half of a load
def test_matches_the_emulation_in_each_build(isa, rows, out_features, group):
    codes, scale, zero = random_weight(out_features, 256, group, 4, seed=rows)
    x, b = torch.randn(rows, 1, 256), torch.randn(out_features)
    x[0, 0, :32] = 0  # a block of zeros: its scale is 0, not a division by 0
    x[-1, 0, 70] = 50.0  # an outlier: its block's other inputs round coarsely, the same in both
    packed = nibbles.pack(codes, scale, zero)
    assert_matches(kernel.linear(x, packed, b), emulated(x, codes, scale, zero, 4, b))
    assert_matches(kernel.linear(x, packed), emulated(x, codes, scale, zero, 4))


@needs_kernel
def test_error_against_fp32_is_that_of_8_bit_inputs():
    codes, scale, zero = random_weight(64, 576, 64, 4, seed=0)
    x = torch.randn(4, 576)
    exact = reference_linear(x, codes, scale, zero, 4)
    y = kernel.linear(x, nibbles.pack(codes, scale, zero))
    err = ((y - exact).norm() / exact.norm()).item()
    assert 1e-4 < err < 0.02  # rounded (not fp32), and only by x's 8-bit steps


@needs_kernel
def test_isa_names_the_dot_product():
    assert kernel.isa() in ("avx2-maddubs", "avx-vnni", "avx512-vnni")


def test_shapes_it_cannot_run_are_refused():
    codes, scale, zero = random_weight(8, 96, 32, 4, seed=0)
    packed = nibbles.pack(codes, scale, zero)  # 96 inputs: not whole loads of 64; the fp32 kernel runs them
    assert not kernel.supports(packed[1], 96)
    with pytest.raises(ValueError, match="a multiple of 64"):
        kernel.linear(torch.randn(1, 96), packed)
    codes, scale, zero = random_weight(8, 192, 96, 4, seed=0)  # groups of 96 straddle the loads
    assert not kernel.supports(nibbles.pack(codes, scale, zero)[1], 192)
