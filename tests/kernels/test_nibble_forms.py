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
