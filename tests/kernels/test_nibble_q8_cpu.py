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
forms = importlib.import_module("compress.kernels.nibble_forms")
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


def fp16_exact(scale: torch.Tensor) -> torch.Tensor:
    return scale.half().float()


@needs_kernel
@pytest.mark.parametrize("zeros, form", [((8,), "fp16 symmetric"), ((7, 8), "fp16 symmetric"), ((), "fp16")])
@pytest.mark.parametrize("group", [32, 64])
def test_compact_forms_hold_the_same_weight_and_compute_as_ggml(isa, zeros, form, group):
    codes, scale, _ = random_weight(29, 256, group, 4, seed=len(zeros))
    scale = fp16_exact(scale)
    if zeros:  # Q4_0: zero point 8, or 7 where a block's d < 0 was read as -d with mirrored codes
        pick = torch.randint(0, len(zeros), scale.shape, generator=torch.Generator().manual_seed(1))
        packed = nibbles.pack(codes, scale, torch.tensor(zeros, dtype=torch.int32)[pick])
    else:  # Q4_1: w = d q + m, d and m fp16
        packed = nibbles.pack_offsets(codes, scale, fp16_exact(torch.randn(scale.shape) * 0.1))
    small = forms.compact(packed)
    assert forms.form(small) == form and small[1].dtype == torch.float16
    assert small[2].shape == ((29, 0) if form == "fp16 symmetric" else scale.shape)
    assert small[1].nbytes + small[2].nbytes <= (packed[1].nbytes + packed[2].nbytes) / 2  # read besides the codes
    assert torch.equal(nibbles.dequantize(forms.expanded(small)), nibbles.dequantize(packed))  # exactly the weight
    x, b = torch.randn(5, 256), torch.randn(29)
    x[1, :32] = 0
    assert_matches(kernel.linear(x, small, b), as_ggml(x, packed, b, symmetric=bool(zeros)))
    assert forms.compact(small) is small  # already compact


def as_ggml(x, packed, bias, symmetric: bool) -> torch.Tensor:
    """x @ W^T + bias as ggml computes a Q4_0 (Q8_0 x: fp16 steps per 32) or, at groups of 32, a Q4_1 (Q8_1 x: its
    blocks' sums d x sum(xi) rounded to fp16 times the offsets); a Q4_1 form of wider groups as ours (fp32 steps)."""
    w = nibbles.dequantize(packed).double()  # [O, I]
    groups = packed[1].shape[1]
    if symmetric or x.shape[-1] // groups != 32:
        xr = reference.round_blocks_int8(x, 32, "fp16" if symmetric else "fp32")
        return (xr.double() @ w.T + bias.double()).float()
    offsets = packed[2].double()  # [O, G]
    xb = x.unflatten(-1, (-1, 32))  # [M, G, 32]
    amax = xb.abs().amax(-1)  # [M, G]
    xi = torch.round(xb * torch.where(amax > 0, 127 / torch.where(amax > 0, amax, 1), 0)[..., None])
    sums = ((amax / 127) * xi.sum(-1)).half().double()  # [M, G]: Q8_1's s
    xr = reference.round_blocks_int8(x, 32, "fp16").double()
    w_no_offsets = w - offsets.repeat_interleave(32, 1)
    return (xr @ w_no_offsets.T + sums @ offsets.T + bias.double()).float()


def test_compact_scales_with_fp32_offsets_are_refused():
    codes, scale, zero = random_weight(8, 128, 32, 4, seed=0)
    c, s, o = nibbles.pack(codes, fp16_exact(scale), zero)
    with pytest.raises(ValueError, match="fp16 offsets"):
        kernel.linear(torch.randn(1, 128), (c, s.half(), o))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 4, 6])
def test_super_block_form_computes_as_ggml_s_q4_k_in_each_build(isa, rows):
    from tests.kernels.test_nibble_forms import q4_k

    packed = q4_k(29, 512, seed=rows)  # a Q4_K: d * sc and -dmin * m per group of 32
    small = forms.compact(packed)
    assert forms.form(small) == forms.SUPER
    x, b = torch.randn(rows, 512), torch.randn(29)
    x[0, 256:] = 0  # a super-block of zeros: step 0
    xr = reference.round_blocks_int8(x, 256, "reciprocal")  # ggml's Q8_K x: one step per 256 inputs
    assert_matches(kernel.linear(x, small, b), (xr.double() @ nibbles.dequantize(packed).double().T + b.double()).float())
    with pytest.raises(ValueError, match="super-blocks of 8"):
        kernel.linear(x, (small[0], small[1], small[2][:, :1]))
