"""The CPU GEMM over packed panels against F.linear."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.linear_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 13, 64])  # a partial tile, one tile, tiles plus a remainder
@pytest.mark.parametrize("out_features", [32, 29])  # whole panels, and a ragged last panel
def test_matches_torch(rows, out_features):
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 1, 96, generator=g), torch.randn(out_features, 96, generator=g), torch.randn(out_features, generator=g)
    panels = kernel.pack(w)
    assert_matches(kernel.linear(x, panels, out_features, b), F.linear(x, w, b))
    assert_matches(kernel.linear(x, panels, out_features), F.linear(x, w))


@needs_kernel
def test_threads_odd_widths_and_non_contiguous_inputs():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(17, 23, generator=g).t(), torch.randn(17, 40, generator=g).t()  # [23, 17], [40, 17]: views
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.linear(x, kernel.pack(w), 40), F.linear(x, w))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_no_rows_gives_an_empty_result():
    w = torch.randn(20, 8)
    assert kernel.linear(torch.randn(0, 8), kernel.pack(w), 20).shape == (0, 20)


def test_pack_interleaves_sixteen_output_rows_and_pads_with_zeros():
    w = torch.arange(20 * 3, dtype=torch.float32).view(20, 3)  # [O=20, I=3]
    panels = kernel.pack(w)
    assert panels.shape == (2, 3, 16)
    assert torch.equal(panels[1, 2, :4], w[16:, 2]) and torch.equal(panels[0, 1], w[:16, 1])
    assert not panels[1, :, 4:].any()


def test_what_it_rejects():
    w = torch.randn(16, 32)
    panels = kernel.pack(w)
    with pytest.raises(ValueError, match="do not pack 40 output rows"):
        kernel.linear(torch.randn(2, 32), panels, 40)
    with pytest.raises(ValueError, match="32 features"):
        kernel.linear(torch.randn(2, 31), panels, 16)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 32).double(), panels, 16)
    with pytest.raises(ValueError, match=r"bias must have shape \[16\]"):
        kernel.linear(torch.randn(2, 32), panels, 16, torch.randn(15))
    with pytest.raises(ValueError, match="on the CPU"):
        kernel.linear(torch.randn(2, 32, device="meta"), panels, 16)
    with pytest.raises(ValueError, match="2-D torch.float32"):
        kernel.pack(w.double())
    assert not kernel.supports(w.double())
