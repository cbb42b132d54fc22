"""Paged decode attention against reference.paged_attention (interpreter on CPU)."""

import importlib

import pytest
import torch

from compress.kernels import reference
from compress.model.attention import attend, window_mask
from tests.kernels.conftest import cuda_only
from tests.kernels.tolerance import assert_matches

kernel = importlib.import_module("compress.kernels.paged_attention")
BLOCK_SIZE = 16


def operands(lens, heads, kv_heads, dim, dtype=torch.float32, device="cpu", num_blocks=24, seed=0):
    """Random caches and a shuffled block table giving each sequence ceil(len / 16) distinct blocks."""
    g = torch.Generator().manual_seed(seed)
    per_seq = max(-(-n // BLOCK_SIZE) for n in lens)
    q = torch.randn(len(lens), heads, dim, generator=g).to(dtype)  # [S, H, D]
    k_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=g).to(dtype)
    v_cache = torch.randn(num_blocks, BLOCK_SIZE, kv_heads, dim, generator=g).to(dtype)
    tables = torch.randperm(num_blocks, generator=g)[: len(lens) * per_seq].view(len(lens), per_seq).int()
    args = (q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32))
    return tuple(t.to(device) for t in args)


@pytest.mark.parametrize("ratio", [1, 3, 8])  # query heads per KV head
def test_matches_reference_ragged(ratio, device):
    args = operands([1, 17, 40], 2 * ratio, 2, 32, device=device)  # 1 token, one past a block, 2.5 blocks
    assert_matches(kernel.paged_attention(*args), reference.paged_attention(*args))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype, device):
    args = operands([5, 33], 6, 2, 64, dtype, device)
    assert_matches(kernel.paged_attention(*args), reference.paged_attention(*args))


def test_head_dim_not_power_of_two_and_custom_scale(device):
    args = operands([20, 3], 4, 4, 24, device=device)
    assert_matches(kernel.paged_attention(*args, scale=0.3), reference.paged_attention(*args, scale=0.3))


# (softcap, window): the cap alone, a window shorter than most contexts, one longer than every context, both.
OPTIONS = [(5.0, None), (None, 7), (None, 100), (2.0, 16)]


@pytest.mark.parametrize("softcap, window", OPTIONS)
@pytest.mark.parametrize("ratio", [1, 4])  # query heads per KV head
def test_softcap_and_window(softcap, window, ratio, device):
    args = operands([1, 17, 40, 70], 2 * ratio, 2, 32, device=device, num_blocks=24)
    q = args[0] * 4  # large scores: the cap changes them
    got = kernel.paged_attention(q, *args[1:], scale=0.5, softcap=softcap, window=window)
    assert_matches(got, reference.paged_attention(q, *args[1:], scale=0.5, softcap=softcap, window=window))


def test_reference_softcap_and_window_against_attend():
    """The oracle against compress.model.attention.attend, the model's math, with its window mask."""
    q, k, v, tables, lens = operands([1, 17, 40], 4, 2, 16)
    for softcap, window in OPTIONS:
        got = reference.paged_attention(q, k, v, tables, lens, 0.3, softcap, window)
        for s, n in enumerate(lens.tolist()):
            keys, values = (c[tables[s].long()].flatten(0, 1)[:n].transpose(0, 1)[None] for c in (k, v))  # [1, KVH, n, D]
            mask = window_mask(torch.tensor([n - 1]), n, window)  # [1, n]
            want = attend(q[s, :, None][None], keys, values, mask, False, 0.3, softcap)[0, :, 0]  # [H, D]
            torch.testing.assert_close(got[s], want, atol=1e-5, rtol=1e-5)


def test_rejects_bad_inputs():
    q, k, v, tables, lens = operands([3], 6, 4, 16)  # 6 heads over 4 KV heads
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        kernel.paged_attention(q, k, v, tables, lens)
    q, k, v, tables, lens = operands([3], 4, 2, 16)
    with pytest.raises(ValueError, match="block_tables must be torch.int32"):
        kernel.paged_attention(q, k, v, tables.long(), lens)
    with pytest.raises(ValueError, match="v_cache must be"):
        kernel.paged_attention(q, k, v.half(), tables, lens)
    with pytest.raises(ValueError, match="window"):
        kernel.paged_attention(q, k, v, tables, lens, window=0)
    with pytest.raises(ValueError, match="softcap"):
        kernel.paged_attention(q, k, v, tables, lens, softcap=-1.0)


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("softcap, window", [(None, None), (50.0, 1024)])
def test_long_context_on_gpu(softcap, window):
    args = operands([1, 700, 2049, 4096], 32, 8, 128, torch.float16, "cuda", num_blocks=1024)
    got = kernel.paged_attention(*args, softcap=softcap, window=window)
    assert_matches(got, reference.paged_attention(*args, softcap=softcap, window=window))
