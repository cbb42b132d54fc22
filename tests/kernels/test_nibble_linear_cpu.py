"""The 4-bit CPU GEMM and its dequantize against the reference on the same pack-quantized weight, in each x86 build."""

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
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13, 64])  # the in-register tiles (<= 4 rows), the block-dequantized path
@pytest.mark.parametrize("out_features", [36, 29])  # whole tiles, and a ragged last one
@pytest.mark.parametrize("bits", [4, 3])
def test_matches_the_reference_in_each_build(isa, rows, out_features, bits):
    codes, scale, zero = random_weight(out_features, 96, 32, bits, seed=rows)
    x, b = torch.randn(rows, 1, 96), torch.randn(out_features)
    packed = kernel.pack(codes, scale, zero)
    assert_matches(kernel.linear(x, packed, b), reference_linear(x, codes, scale, zero, bits, b))
    assert_matches(kernel.linear(x, packed), reference_linear(x, codes, scale, zero, bits))


@needs_kernel
@pytest.mark.parametrize("rows,in_features,group", [(2, 1024, 1024), (30, 1536, 64), (40, 2048, 128), (300, 1600, 64)])
def test_whole_row_groups_and_blocks_of_inputs(isa, rows, in_features, group):
    """One group per row; x within one 256 KiB block: one block of inputs, wider than KC; several blocks of about
    KC inputs (whole groups each, the last shorter); x beyond one 256 KiB block."""
    codes, scale, zero = random_weight(20, in_features, group, 4, seed=rows)
    x = torch.randn(rows, in_features)
    assert_matches(kernel.linear(x, kernel.pack(codes, scale, zero)), reference_linear(x, codes, scale, zero, 4))


@needs_kernel
def test_dequantize_gives_the_reference_weight(isa):
    codes, scale, zero = random_weight(29, 128, 64, 4, seed=3)
    ref = reference.dequantize_packed(packing.pack(codes, 4), scale, packing.pack_zero_points(zero, 4), 4, 128)
    assert_matches(kernel.dequantize(kernel.pack(codes, scale, zero)), ref)
    scratch = torch.full((29 * 128 + 5,), float("nan"))
    w = kernel.dequantize(kernel.pack(codes, scale, zero), scratch)
    assert w.data_ptr() == scratch.data_ptr() and w.shape == (29, 128)  # written into the buffer given
    assert_matches(w, ref)
    with pytest.raises(ValueError, match="at least 3712"):
        kernel.dequantize(kernel.pack(codes, scale, zero), torch.empty(100))


@needs_kernel
def test_threads_and_non_contiguous_inputs():
    codes, scale, zero = random_weight(40, 64, 32, 4, seed=1)
    x = torch.randn(64, 9).t()  # [9, 64]: a view
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert_matches(kernel.linear(x, kernel.pack(codes, scale, zero)), reference_linear(x, codes, scale, zero, 4))
    finally:
        torch.set_num_threads(threads)


@needs_kernel
def test_no_rows_gives_an_empty_result():
    packed = kernel.pack(*random_weight(20, 32, 32, 4, seed=0))
    assert kernel.linear(torch.randn(0, 32), packed).shape == (0, 20)


def test_pack_puts_codes_j_and_j_plus_16_of_a_chunk_in_one_byte():
    codes = (torch.arange(3 * 64) % 16).to(torch.uint8).view(3, 64)  # [O=3, I=64]: two chunks per row
    scale, zero = torch.full((3, 2), 0.5), torch.full((3, 2), 3, dtype=torch.int32)
    q, s, o = kernel.pack(codes, scale, zero)
    assert q.shape == (3, 32) and s.shape == o.shape == (3, 2)
    assert q[1, 2] == codes[1, 2] | (codes[1, 18] << 4)
    assert q[2, 16 + 5] == codes[2, 32 + 5] | (codes[2, 32 + 21] << 4)  # the second chunk
    assert s[0, 1] == 0.5 and o[0, 1] == -1.5  # offset = -zero * scale


def test_what_it_rejects():
    codes, scale, zero = random_weight(16, 64, 32, 4, seed=0)
    packed = kernel.pack(codes, scale, zero)
    with pytest.raises(ValueError, match="64 features"):
        kernel.linear(torch.randn(2, 63), packed)
    with pytest.raises(ValueError, match="float32"):
        kernel.linear(torch.randn(2, 64).double(), packed)
    with pytest.raises(ValueError, match="on the CPU"):
        kernel.linear(torch.randn(2, 64, device="meta"), packed)
    with pytest.raises(ValueError, match="do not describe one weight"):
        kernel.linear(torch.randn(2, 64), (packed[0], packed[1][:8], packed[2]))
    with pytest.raises(ValueError, match="below 16"):
        kernel.pack(codes.int().to(torch.uint8) + 16, scale, zero)
    with pytest.raises(ValueError, match="one grouped weight"):
        kernel.pack(codes, scale[:, :1].expand(16, 3), zero[:, :1].expand(16, 3))
    with pytest.raises(ValueError, match="multiple of 32"):
        kernel.pack(*random_weight(16, 48, 16, 4, seed=0))
    assert not kernel.supports(torch.ones(4, 3), 48)  # groups of 16 codes
