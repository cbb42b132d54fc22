"""The few-row CPU linear kernel against F.linear."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.linear_cpu")
pytestmark = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@pytest.mark.parametrize("rows", [1, 2, 5, kernel.MAX_ROWS])
@pytest.mark.parametrize("out_features", [24, 29])  # a whole number of 8-row blocks, and a ragged last block
def test_matches_torch(rows, out_features):
    g = torch.Generator().manual_seed(rows)
    x, w, b = torch.randn(rows, 1, 96, generator=g), torch.randn(out_features, 96, generator=g), torch.randn(out_features, generator=g)
    assert_matches(kernel.linear(x, w, b), F.linear(x, w, b))
    assert_matches(kernel.linear(x, w), F.linear(x, w))


def test_threads_and_a_non_contiguous_weight():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 64, generator=g), torch.randn(64, 40, generator=g).t()  # [40, 64], transposed view
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.linear(x, w), F.linear(x, w))
    finally:
        torch.set_num_threads(threads)


def test_which_inputs_it_takes_and_rejects():
    w = torch.randn(16, 32)
    assert kernel.supports(torch.randn(kernel.MAX_ROWS, 32), w)
    assert not kernel.supports(torch.randn(kernel.MAX_ROWS + 1, 32), w)
    assert not kernel.supports(torch.randn(2, 32, dtype=torch.float64), w.double())
    with pytest.raises(ValueError, match="at most"):
        kernel.linear(torch.randn(kernel.MAX_ROWS + 1, 32), w)
    with pytest.raises(ValueError, match="32 features"):
        kernel.linear(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 32).double(), w)
