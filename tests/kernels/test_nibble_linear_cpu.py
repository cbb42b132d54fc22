"""The 4-bit CPU GEMM against the reference dequant-matmul on the same pack-quantized weight."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.quant import packing
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.nibble_linear_cpu")
needs_kernel = pytest.mark.skipif(kernel.load() is None, reason="no C compiler builds the kernel here")


def random_weight(out_features: int, in_features: int, group: int, bits: int, seed: int):
    """(codes [O, I] uint8, scale [O, G], zero [O, G] int32) drawn at random."""
    g = torch.Generator().manual_seed(seed)
    groups = in_features // group
    codes = torch.randint(0, 2**bits, (out_features, in_features), generator=g).to(torch.uint8)
    scale = torch.rand(out_features, groups, generator=g) * 0.1 + 0.01
    zero = torch.randint(0, 2**bits, (out_features, groups), generator=g).to(torch.int32)
    return codes, scale, zero


def reference_linear(x, codes, scale, zero, bits, bias=None):
    packed = packing.pack(codes, bits)
    return reference.dequant_matmul(x, packed, scale, packing.pack_zero_points(zero, bits), bits, bias)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 6, 7, 13, 64])  # each tile size, tiles plus a remainder
@pytest.mark.parametrize("out_features", [32, 29])  # whole panels, and a ragged last panel
@pytest.mark.parametrize("bits", [4, 3])
def test_matches_the_reference(rows, out_features, bits):
    codes, scale, zero = random_weight(out_features, 96, 32, bits, seed=rows)
    x, b = torch.randn(rows, 1, 96), torch.randn(out_features)
    packed = kernel.pack(codes, scale, zero)
    assert_matches(kernel.linear(x, packed, out_features, b), reference_linear(x, codes, scale, zero, bits, b))
    assert_matches(kernel.linear(x, packed, out_features), reference_linear(x, codes, scale, zero, bits))


@needs_kernel
@pytest.mark.parametrize("group", [3, 96])  # odd group (the two-chain loop's remainder), one group per row
def test_odd_and_whole_row_groups(group):
    codes, scale, zero = random_weight(20, 96, group, 4, seed=group)
    x = torch.randn(2, 96)
    assert_matches(kernel.linear(x, kernel.pack(codes, scale, zero), 20), reference_linear(x, codes, scale, zero, 4))


@needs_kernel
def test_threads_and_non_contiguous_inputs():
    codes, scale, zero = random_weight(40, 64, 16, 4, seed=1)
    x = torch.randn(64, 9).t()  # [9, 64]: a view
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.linear(x, kernel.pack(codes, scale, zero), 40), reference_linear(x, codes, scale, zero, 4))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_no_rows_gives_an_empty_result():
    packed = kernel.pack(*random_weight(20, 32, 16, 4, seed=0))
    assert kernel.linear(torch.randn(0, 32), packed, 20).shape == (0, 20)


def test_pack_puts_rows_j_and_j_plus_8_in_one_byte():
    codes = (torch.arange(20 * 3) % 16).to(torch.uint8).view(20, 3)  # [O=20, I=3]
    scale, zero = torch.full((20, 1), 0.5), torch.full((20, 1), 3, dtype=torch.int32)
    q, s, o = kernel.pack(codes, scale, zero)
    assert q.shape == (2, 3, 8) and s.shape == o.shape == (2, 1, 16)
    assert q[0, 1, 2] == codes[2, 1] | (codes[10, 1] << 4)
    assert q[1, 2, 3] == codes[19, 2] and not q[1, :, 4:].any()  # rows past 20 are zero
    assert s[0, 0, 5] == 0.5 and o[0, 0, 5] == -1.5  # offset = -zero * scale


def test_what_it_rejects():
    codes, scale, zero = random_weight(16, 32, 16, 4, seed=0)
    packed = kernel.pack(codes, scale, zero)
    with pytest.raises(ValueError, match="do not hold 40 output rows"):
        kernel.linear(torch.randn(2, 32), packed, 40)
    with pytest.raises(ValueError, match="32 features"):
        kernel.linear(torch.randn(2, 31), packed, 16)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 32).double(), packed, 16)
    with pytest.raises(ValueError, match="on the CPU"):
        kernel.linear(torch.randn(2, 32, device="meta"), packed, 16)
    with pytest.raises(ValueError, match="below 16"):
        kernel.pack(codes.int().to(torch.uint8) + 16, scale, zero)
    with pytest.raises(ValueError, match="one grouped weight"):
        kernel.pack(codes, scale[:, :1].expand(16, 3), zero[:, :1].expand(16, 3))
