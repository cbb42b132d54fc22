"""The panel GEMM (W packed per call) against F.linear, in each x86 build, over each weight format that packs
into its panels: fp32 here, 4-bit nibbles and int8 rows straight from their codes."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_linear_cpu import assert_like_f_linear
from tests.kernels.test_nibble_linear_cpu import random_weight, reference_linear
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.panel_cpu")
nibble = importlib.import_module("compress.kernels.nibble_linear_cpu")
int8_rows = importlib.import_module("compress.kernels.int8_rows_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")

# Partial and whole 6-row micro-tiles; outputs in whole panels (64 with AVX-512, 16 with AVX2), a part of a
# panel's vectors, a ragged last vector; inputs within one 256-input panel, and in several with a short last one.
ROWS = [1, 5, 6, 13, 64]
SHAPES = [(128, 96), (40, 96), (29, 100), (7, 600)]


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_fp32_matches_torch_in_each_build(isa, rows, out_features, in_features):
    assert_like_f_linear(kernel.linear, rows, out_features, in_features)


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features,group", [(128, 96, 32), (29, 640, 64), (20, 1024, 1024)])
def test_nibbles_match_the_reference_in_each_build(isa, rows, out_features, in_features, group):
    """Panels of whole groups: several of 256 inputs, of 192 (three 64-input groups), one group wider than a panel."""
    codes, scale, zero = random_weight(out_features, in_features, group, 4, seed=rows)
    x, b = torch.randn(rows, in_features), torch.randn(out_features)
    assert_matches(nibble.panel(x, nibble.pack(codes, scale, zero), b), reference_linear(x, codes, scale, zero, 4, b))


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
def test_int8_rows_match_torch_on_the_dequantized_weight_in_each_build(isa, rows):
    g = torch.Generator().manual_seed(rows)
    w, x = torch.randn(29, 600, generator=g), torch.randn(rows, 600, generator=g)
    packed = int8_rows.quantize(w)
    assert_matches(int8_rows.panel(x, packed), F.linear(x, int8_rows.dequantize(packed)))


@needs_kernel
@pytest.mark.parametrize("out_features", [200, 1000])  # few panels a thread: shares of the rows; many: of the outputs
def test_threads_share_the_outputs_or_the_rows(out_features):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(70, 300, generator=g), torch.randn(out_features, 300, generator=g)
    codes, scale, zero = random_weight(out_features, 256, 64, 4, seed=1)
    threads = torch.get_num_threads()
    try:
        for n in (2, 3):
            torch.set_num_threads(n)
            assert_matches(kernel.linear(x, w), F.linear(x, w))
            assert_matches(nibble.panel(x[:, :256], nibble.pack(codes, scale, zero)), reference_linear(x[:, :256], codes, scale, zero, 4))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_empty_shapes_and_what_it_rejects():
    assert kernel.linear(torch.randn(0, 8), torch.randn(20, 8)).shape == (0, 20)
    assert torch.equal(kernel.linear(torch.randn(3, 0), torch.randn(5, 0)), torch.zeros(3, 5))  # an empty sum
    w = torch.randn(16, 32)
    with pytest.raises(ValueError, match="do not make"):
        kernel.linear(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 32).double(), w)
    with pytest.raises(ValueError, match=r"bias must have shape \[16\]"):
        kernel.linear(torch.randn(2, 32), w, torch.randn(15))
