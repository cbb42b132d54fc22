"""The C rotary embedding against the decoder's torch expression, bit for bit (in each x86 build)."""

import pytest
import torch

from compress.kernels import rope_cpu
from compress.model.rope import apply_rope

needs_compiler = pytest.mark.skipif(rope_cpu.load() is None, reason="no C compiler builds the kernel here")


def tables(b, t, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    angles = torch.rand(b, t, d // 2, generator=g) * 100
    emb = torch.cat((angles, angles), -1)  # [B, T, D]: as Decoder.rope builds them
    return emb.cos(), emb.sin()


@needs_compiler
@pytest.mark.parametrize("shape", [(1, 1, 9, 64), (2, 37, 3, 64), (1, 5, 4, 128), (1, 3, 2, 6), (1, 1200, 8, 64)])
def test_same_numbers_as_torch(isa, shape):
    b, t, h, d = shape
    x = torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 10
    cos, sin = tables(b, t, d)
    assert rope_cpu.supports(x, cos)
    assert torch.equal(rope_cpu.rope(x, cos, sin), apply_rope(x, cos, sin))


@needs_compiler
def test_takes_a_view_of_joined_projections():
    """q and k come as views of the qkv projection's output, not contiguous."""
    qkv = torch.randn(1, 4, (6 + 2 + 2) * 16)
    q = qkv[..., : 6 * 16].view(1, 4, 6, 16)
    assert not q.is_contiguous()
    cos, sin = tables(1, 4, 16)
    assert torch.equal(rope_cpu.rope(q, cos, sin), apply_rope(q, cos, sin))


def test_declines_what_it_does_not_take():
    x, (cos, _) = torch.randn(1, 2, 3, 8), tables(1, 2, 8)
    assert not rope_cpu.supports(x.double(), cos.double())
    assert not rope_cpu.supports(x[..., :7], cos[..., :7])  # odd head size
    assert not rope_cpu.supports(x, cos[:, :1])  # tables for another number of tokens
    assert not rope_cpu.supports(x.requires_grad_(), cos)  # training needs autograd
