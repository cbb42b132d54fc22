"""The panel GEMM over fp32 W (packed per call) against F.linear, in each x86 build; its driver over the other
formats' panels: test_nibble_panel_cpu.py, test_int8_rows_cpu.py."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.test_linear_cpu import assert_like_f_linear
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.panel_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")

# Partial and whole 6-row micro-tiles; outputs in whole panels (64 with AVX-512, 16 with AVX2), a part of a
# panel's vectors, a ragged last vector; inputs within one 256-input panel, and in several.
ROWS = [1, 5, 6, 13, 64]
SHAPES = [(128, 96), (40, 96), (29, 100), (7, 600)]


@needs_kernel
@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_matches_torch_in_each_build(isa, rows, out_features, in_features):
    assert_like_f_linear(kernel.linear, rows, out_features, in_features)


def with_threads(check) -> None:
    """check() at 2 and 3 threads, torch's thread count restored after."""
    threads = torch.get_num_threads()
    try:
        for n in (2, 3):
            torch.set_num_threads(n)
            check()
    finally:
        torch.set_num_threads(threads)


@needs_kernel
@pytest.mark.parametrize("out_features", [100, 1000])  # few panels a thread (in both builds): shares of the rows; many: of the outputs
def test_threads_share_the_outputs_or_the_rows(isa, out_features):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(70, 300, generator=g), torch.randn(out_features, 300, generator=g)
    with_threads(lambda: assert_matches(kernel.linear(x, w), F.linear(x, w)))


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
