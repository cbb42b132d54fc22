"""The forms of a packed int4 weight's scales and offsets: fp16 only where it holds every value exactly."""

import torch

from compress.kernels import nibble_forms as forms
from compress.kernels import nibble_linear_cpu as nibbles
from tests.kernels.test_nibble_linear_cpu import random_weight
from tests.kernels.test_nibble_q8_cpu import fp16_exact


def test_weights_fp16_cannot_hold_exactly_stay_fp32():
    codes, scale, zero = random_weight(8, 128, 32, 4, seed=0)  # scales with fp32's 24-bit mantissas
    packed = nibbles.pack(codes, scale, zero)
    assert forms.compact(packed) is packed and forms.form(packed) == "fp32"
    offsets = packed[2] + 1e-4  # scales exact in fp16, offsets not
    mixed = (packed[0], fp16_exact(packed[1]), offsets)
    assert forms.form(forms.compact(mixed)) == "fp32"
    assert forms.expanded(packed) is packed


def test_expanded_gives_pack_s_fp32_form_back_exactly():
    codes, scale, _ = random_weight(16, 128, 32, 4, seed=2)
    zero = torch.where(torch.rand(16, 4) < 0.5, 7, 8).to(torch.int32)  # Q4_0 groups, some mirrored
    packed = nibbles.pack(codes, fp16_exact(scale), zero)
    small = forms.compact(packed)
    assert forms.form(small) == "fp16 symmetric"
    assert torch.equal(nibbles.dequantize(forms.expanded(small)), nibbles.dequantize(packed))


def q4_k(out_features: int, in_features: int, seed: int = 0):
    """A Q4_K weight as a GGUF read holds it: codes, fp32 scales d * sc and offsets -dmin * m per group of 32."""
    g = torch.Generator().manual_seed(seed)
    groups = in_features // 32
    codes = torch.randint(0, 16, (out_features, in_features), dtype=torch.uint8, generator=g)
    d, dmin = ((torch.rand(out_features, groups // 8, 1, generator=g) * 0.01).half().float() for _ in range(2))
    sc, m = (torch.randint(0, 64, (out_features, groups // 8, 8), generator=g).float() for _ in range(2))
    return nibbles.pack_offsets(codes, (d * sc).view(out_features, groups), (-dmin * m).view(out_features, groups))


def test_a_q4_k_is_held_in_super_blocks_and_expands_back_exactly():
    packed = q4_k(12, 512)
    small = forms.compact(packed)
    assert forms.form(small) == forms.SUPER
    assert (small[1].dtype, tuple(small[1].shape), small[2].dtype, tuple(small[2].shape)) == (torch.uint8, (12, 16, 2), torch.float32, (12, 2, 2))
    assert (small[1].nbytes + small[2].nbytes) * 8 / (12 * 512) == 0.75  # 4.75 bits a weight with the codes, from 6
    assert all(torch.equal(a, b) for a, b in zip(forms.expanded(small), packed))
    assert forms.compact(small) is small


def test_super_blocks_only_where_groups_of_32_fill_them():
    codes, scales, offsets = q4_k(4, 512)
    assert forms.super_blocks((codes, scales[:, ::2].contiguous(), offsets[:, ::2].contiguous())) is None  # groups of 64
    codes, scales, offsets = q4_k(4, 256)
    seven = (codes[:, :112].contiguous(), scales[:, :7].contiguous(), offsets[:, :7].contiguous())  # 224 inputs
    assert forms.super_blocks(seven) is None  # no whole super-block
    assert forms.super_blocks((codes, scales + 1e-3, offsets)) is None  # not one unit times bytes
    assert forms.super_blocks((codes, scales, offsets)) is not None
