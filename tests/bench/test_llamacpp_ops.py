"""The ggml emulation the per-op comparison runs our decoder with: each Linear's input rounded as ggml rounds it for
the Linear's type, attention through fp16 as llama.cpp's default context computes it."""

import torch

from compress.bench.llamacpp_ops import as_ggml, attend_f16, ggml_rounding
from compress.kernels import reference
from compress.model import attention
from compress.quant.linear import GgufLinear


def test_inputs_are_rounded_per_the_linear_s_type():
    x = torch.randn(2, 512)
    k_quant, q8_0 = GgufLinear(512, 4, "Q4_K", False), GgufLinear(512, 4, "Q8_0", False)
    assert torch.equal(ggml_rounding(k_quant, (x,))[0], reference.round_blocks_int8(x, 256, "reciprocal"))
    assert torch.equal(ggml_rounding(q8_0, (x,))[0], reference.round_blocks_int8(x, 32, "fp16"))
    narrow = GgufLinear(96, 4, "Q6_K", False)  # no whole super-blocks: ggml's file would hold Q8_0 there
    x = torch.randn(1, 96)
    assert torch.equal(ggml_rounding(narrow, (x,))[0], reference.round_blocks_int8(x, 32, "fp16"))


def test_attention_through_fp16_is_the_plain_one_on_fp16_inputs_up_to_the_weights_rounding():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 4, 5, 8, generator=g).half().float() for _ in range(3))
    k, v = k[:, :2], v[:, :2]  # 2 KV heads for 4 query heads
    ours = attend_f16(q, k, v, None, True, None, None)
    plain = attention.attend(q, k, v, None, True, None, None)
    err = (ours - plain).abs().max().item()
    assert 0 < err < 2e-3 * plain.abs().max().item()  # only the softmax weights' fp16 rounding apart
    assert torch.equal(ours[:, :, 0], v.repeat_interleave(2, 1)[:, :, 0])  # the first query sees one key: V


def test_as_ggml_undoes_itself():
    model = torch.nn.Sequential(torch.nn.Linear(64, 4))
    plain = attention.attend
    with as_ggml(model):
        assert attention.attend is attend_f16 and len(model[0]._forward_pre_hooks) == 1
    assert attention.attend is plain and not model[0]._forward_pre_hooks
