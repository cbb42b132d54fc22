"""The 4-bit panel GEMM (codes dequantized into panel_cpu's panels) against the reference, in each x86 build."""

import importlib

import pytest
import torch

from tests.kernels.test_nibble_linear_cpu import random_weight, reference_linear
from tests.kernels.test_panel_cpu import ROWS, with_threads
from tests.kernels.tolerance import assert_matches

nibble = importlib.import_module("compress.kernels.nibble_linear_cpu")
kernel = importlib.import_module("compress.kernels.nibble_panel_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features,group", [(128, 96, 32), (29, 640, 64), (20, 1024, 1024)])
def test_matches_the_reference_in_each_build(isa, rows, out_features, in_features, group):
    """Rows in blocks of VW and a last shorter one; panels of whole groups: several of 256 inputs, of 192 (three
    64-input groups), one group wider than a panel."""
    codes, scale, zero = random_weight(out_features, in_features, group, 4, seed=rows)
    x, b = torch.randn(rows, in_features), torch.randn(out_features)
    assert_matches(kernel.linear(x, nibble.pack(codes, scale, zero), b), reference_linear(x, codes, scale, zero, 4, b))


@needs_kernel
@pytest.mark.parametrize("out_features", [100, 1000])  # few panels a thread (in both builds): shares of the rows; many: of the outputs
def test_threads_share_the_outputs_or_the_rows(isa, out_features):
    codes, scale, zero = random_weight(out_features, 256, 64, 4, seed=1)
    x = torch.randn(70, 256)
    with_threads(lambda: assert_matches(kernel.linear(x, nibble.pack(codes, scale, zero)), reference_linear(x, codes, scale, zero, 4)))


@needs_kernel
def test_what_it_rejects():
    packed = nibble.pack(*random_weight(16, 64, 32, 4, seed=0))
    with pytest.raises(ValueError, match="64 features"):
        kernel.linear(torch.randn(2, 63), packed)
