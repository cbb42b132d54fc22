"""Q6_K held in 6.625 bits a weight (nibbles, 2-bit crumbs, int8 sub-scales and a unit per super-block): its
layout against ggml's codes, and the int8-activation kernel's 6-bit entry against x rounded per block of 32 times the
exact weight, in each x86 build."""

import importlib

import pytest
import torch

from compress.kernels import nibble_forms, reference
from tests.kernels.tolerance import assert_matches

six = importlib.import_module("compress.kernels.nibble_six")
q8 = importlib.import_module("compress.kernels.nibble_q8_cpu")
needs_kernel = pytest.mark.skipif(q8.load() is None, reason="no C compiler or no AVX2 for the kernel here")


def q6_k(out_features: int, in_features: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ggml's unsigned codes [O, I] in [0, 64) and d * sc [O, I/16] as a file's super-blocks give them: d fp16 of
    either sign, sc int8 with the largest at -128."""
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 64, (out_features, in_features), generator=g)
    d = (torch.randn(out_features, in_features // 256, generator=g) * 0.001).half().float()
    sc = torch.randint(-127, 128, (out_features, in_features // 256, 16), generator=g)
    sc[..., 3] = -128
    return codes, (d[..., None] * sc.float()).view(out_features, -1)


def weight(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return ((codes - 32).float().view(codes.shape[0], scale.shape[1], 16) * scale[..., None]).view(codes.shape)  # [O, I]


def test_the_high_bits_sit_where_the_kernel_reads_them():
    codes = torch.zeros(1, 256, dtype=torch.int64)
    codes[0, 16] = 16  # block 0, chunk 0, high nibble of byte 0: byte 0, crumb 1 (bits 2-3) = 1
    codes[0, 33] = 32  # block 0, chunk 1, low nibble of byte 17: byte 17, crumb 0 = 2
    codes[0, 64 + 63] = 63  # block 1, chunk 1, high nibble of byte 31: byte 31, crumb 3 (bits 6-7) = 3
    codes[0, 128 + 64] = 48  # block 3 (the second pair's second), low nibble of byte 0: byte 32, crumb 2 = 3
    _, _, high = six.pack(codes, six.super_scales(torch.ones(1, 16)))
    expected = [0] * 64
    expected[0], expected[17], expected[31], expected[32] = 1 << 2, 2, 3 << 6, 3 << 4
    assert high[0].tolist() == expected


def test_codes_scales_and_weight_come_back_exactly():
    codes, scale = q6_k(29, 512)
    scales = six.super_scales(scale)
    packed = six.pack(codes, scales)
    assert [t.dtype for t in packed] == [torch.uint8] * 3
    assert [tuple(t.shape) for t in packed] == [(29, 256), (29, 2, 20), (29, 128)]
    assert sum(t.nbytes for t in packed) * 8 / codes.numel() == 6.625
    assert nibble_forms.form(packed) == nibble_forms.SIX
    assert torch.equal(six.wide_scales(scales), scale)
    assert torch.equal(six.signed_codes(packed), (codes - 32).to(torch.int8))
    assert torch.equal(six.dequantize(packed), weight(codes, scale))


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 13])  # whole and partial 4-row tiles
@pytest.mark.parametrize("out_features", [36, 29])  # whole tiles and a ragged last one
@pytest.mark.parametrize("in_features", [256, 768])
def test_matches_rounded_x_times_the_exact_weight_in_each_build(isa, rows, out_features, in_features):
    codes, scale = q6_k(out_features, in_features, seed=rows)
    codes[0] = 63  # the largest products: 2 * 63 * 127 per pair in the AVX2 build's int16 sums
    x, b = torch.randn(rows, 1, in_features), torch.randn(out_features)
    x[0, 0, :256] = 0  # a super-block of zeros: its step is 0, not a division by 0
    x[-1, 0, 40] = 50.0  # an outlier: its super-block's other inputs round coarsely, the same in both
    packed = six.pack(codes, six.super_scales(scale))
    xr = reference.round_blocks_int8(x, 256, "reciprocal")  # ggml's Q8_K x: one step per 256 inputs
    expected = (xr.double() @ weight(codes, scale).double().T).float()
    assert_matches(six.linear(x, packed), expected)
    assert_matches(six.linear(x, packed, b), (expected.double() + b.double()).float())


def test_what_it_cannot_hold_or_run_is_refused():
    codes, scale = q6_k(4, 256)
    assert not six.supports(192)  # whole super-blocks only
    assert six.super_scales(torch.randn(4, 16)) is None  # not one unit times int8s: stays a byte a code (cpu_linears)
    assert six.super_scales(torch.ones(4, 12)) is None  # not whole super-blocks
    with pytest.raises(ValueError, match="whole super-blocks of 256"):
        six.pack(codes[:, :192], six.super_scales(scale))
    with pytest.raises(ValueError, match=r"\[0, 64\)"):
        six.pack(codes + 1, six.super_scales(scale))
    packed = six.pack(codes, six.super_scales(scale))
    with pytest.raises(ValueError, match="must end in 256"):
        six.linear(torch.randn(2, 128), packed)
    with pytest.raises(ValueError, match="torch.float32"):
        six.linear(torch.randn(2, 256).double(), packed)


def test_packed_a_few_rows_at_a_time_as_at_once(monkeypatch):
    codes, scale = q6_k(29, 256)
    whole = six.pack(codes, six.super_scales(scale))
    monkeypatch.setattr(six, "ROWS", 8)  # 29 rows: three whole chunks and a short one
    for a, b in zip(six.pack(codes, six.super_scales(scale)), whole):
        assert torch.equal(a, b)
