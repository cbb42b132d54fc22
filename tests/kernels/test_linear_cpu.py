"""The CPU GEMM over the plain [O, I] weight against F.linear, in each x86 build."""

import importlib

import pytest
import torch
import torch.nn.functional as F

from compress.kernels import cpu_build
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.linear_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13, 64])  # partial tiles, one tile, tiles plus a remainder
@pytest.mark.parametrize("out_features,in_features", [(36, 96), (29, 100), (7, 17)])  # whole tiles; ragged in both
def test_matches_torch_in_each_build(isa, rows, out_features, in_features):
    assert_like_f_linear(kernel.linear, rows, out_features, in_features)


def assert_like_f_linear(linear, rows: int, out_features: int, in_features: int) -> None:
    """linear(x, w, b) and linear(x, w) against F.linear on seeded operands, x [rows, 1, in_features]."""
    g = torch.Generator().manual_seed(rows)
    x, w = torch.randn(rows, 1, in_features, generator=g), torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    assert_matches(linear(x, w, b), F.linear(x, w, b))
    assert_matches(linear(x, w), F.linear(x, w))


@needs_kernel
def test_each_build_has_its_vector_width(isa):
    wide = "avx512f" in cpu_build.machine().split()
    expected = {"native": 16 if wide else 8, "avx2": 8}[isa] if cpu_build.X86 else 4
    assert kernel.load().vector_width() == expected


@needs_kernel
def test_blocks_of_a_large_x_and_threads(isa):
    """x beyond one 256 KiB block: inputs cut into blocks of whole vectors, rows into blocks; two threads."""
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(300, 1100, generator=g), torch.randn(50, 1100, generator=g)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.linear(x, w), F.linear(x, w))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_non_contiguous_inputs_and_empty_shapes():
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(17, 23, generator=g).t(), torch.randn(17, 40, generator=g).t()  # [23, 17], [40, 17]: views
    assert_matches(kernel.linear(x, w), F.linear(x, w))
    assert kernel.linear(torch.randn(0, 8), torch.randn(20, 8)).shape == (0, 20)
    assert torch.equal(kernel.linear(torch.randn(3, 0), torch.randn(5, 0)), torch.zeros(3, 5))  # an empty sum


def test_what_it_rejects():
    w = torch.randn(16, 32)
    with pytest.raises(ValueError, match="2-D"):
        kernel.linear(torch.randn(2, 32), w[None])
    with pytest.raises(ValueError, match="32 features"):
        kernel.linear(torch.randn(2, 31), w)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 32).double(), w)
    with pytest.raises(ValueError, match=r"bias must have shape \[16\]"):
        kernel.linear(torch.randn(2, 32), w, torch.randn(15))
    with pytest.raises(ValueError, match="on the CPU"):
        kernel.linear(torch.randn(2, 32, device="meta"), w)
    assert not kernel.supports(w.double())
