"""The paged backend against the kernels' reference (decode) and dense causal attention (prefill)."""

import pytest
import torch
import torch.nn.functional as F

from compress.kernels import paged_attention_cpu, reference
from compress.model.attention import AttentionSpec, attend, window_mask
from compress.runtime.attention import DECODE_ROWS, GROUP_SLACK, AttentionMetadata, PagedAttention, group_by_context

L, NB, BS, H, KV, D = 1, 16, 4, 4, 2, 8


@pytest.fixture(params=["c-kernel", "torch"])
def cpu_path(request):
    """Run a test through the C decode kernel (where it builds) and through the torch fallback."""
    if request.param == "c-kernel" and paged_attention_cpu.load() is None:
        pytest.skip("no C compiler builds the kernel here")
    return request.param


def dense_causal(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True, enable_gqa=True)
    return out.transpose(0, 1)  # [T, H, D]


@pytest.mark.parametrize("lens, tables", [
    # Two decodes, a prefill after a cached prefix, a fresh prefill: short ones (rows of the decode path,
    # as a speculative verification is) and long ones (DECODE_ROWS < n: one causal SDPA each).
    ([1, 1, 6, 7], [[3, 0, 7], [5], [1, 2, 4, 6], [8, 9]]),
    ([1, 1, 18, 19], [[3, 0, 7], [5], [1, 2, 4, 6, 10, 11], [8, 9, 12, 13, 14]]),
])
def test_mixed_step_matches_reference_and_dense(lens, tables, cpu_path):
    torch.manual_seed(0)
    kv = torch.randn(2, L, NB, BS, KV, D)
    starts = [9, 2, 5, 0]  # tokens cached before this step
    meta = AttentionMetadata.build(starts, lens, tables, BS, "cpu")
    assert len(meta.prefills) == sum(n > DECODE_ROWS for n in lens)
    n = sum(lens)
    q, k, v = torch.randn(1, n, H, D), torch.randn(1, n, KV, D), torch.randn(1, n, KV, D)
    out = PagedAttention(kv, meta, AttentionSpec(), cpu_kernel=cpu_path == "c-kernel")(0, q, k, v)[0]  # [N, H, D]

    flat_k, flat_v = kv[0, 0].view(-1, KV, D), kv[1, 0].view(-1, KV, D)
    assert torch.equal(flat_k[meta.slots], k[0]) and torch.equal(flat_v[meta.slots], v[0])
    ref = reference.paged_attention(
        q[0, :2], kv[0, 0], kv[1, 0], torch.tensor([[3, 0, 7], [5, 0, 0]], dtype=torch.int32), torch.tensor([10, 3], dtype=torch.int32)
    )
    torch.testing.assert_close(out[:2], ref, atol=1e-5, rtol=1e-5)

    def seq_kv(i):  # the whole context of sequence i, read back through its block table
        blocks = torch.tensor(tables[i])
        return (c[blocks].reshape(-1, KV, D)[: starts[i] + lens[i]] for c in (kv[0, 0], kv[1, 0]))

    k2, v2 = seq_kv(2)  # [5 + lens[2], KV, D]
    end2 = 2 + lens[2]
    q2 = torch.cat([torch.randn(5, H, D), q[0, 2:end2]])  # queries of the cached tokens do not matter
    torch.testing.assert_close(out[2:end2], dense_causal(q2, k2, v2)[5:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[end2:], dense_causal(q[0, end2:], k[0, end2:], v[0, end2:]), atol=1e-5, rtol=1e-5)


def test_sliding_window_masks_old_tokens():
    torch.manual_seed(1)
    kv = torch.randn(2, L, NB, BS, KV, D)
    meta = AttentionMetadata.build([10], [1], [[0, 1, 2]], BS, "cpu")
    q, k, v = torch.randn(1, 1, H, D), torch.randn(1, 1, KV, D), torch.randn(1, 1, KV, D)
    out = PagedAttention(kv, meta, AttentionSpec((3,)))(0, q, k, v)[0]
    # Only positions 8, 9, 10 count: slots 0-2 of block 2, i.e. the reference over block 2 with 3 tokens.
    ref = reference.paged_attention(
        q[0], kv[0, 0], kv[1, 0], torch.tensor([[2]], dtype=torch.int32), torch.tensor([3], dtype=torch.int32)
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    unwindowed = PagedAttention(kv, meta)(0, q, k, v)[0]
    assert (unwindowed - ref).abs().max() > 1e-3


@pytest.mark.parametrize("layer", [0, 1])  # a window of 5 tokens, then none
def test_mixed_step_with_window_and_softcap_matches_dense(layer, cpu_path):
    torch.manual_seed(3)
    kv = torch.randn(2, 2, NB, BS, KV, D)
    starts, lens, tables = [9, 2, 5], [1, 2, 18], [[3, 0, 7], [5], [1, 2, 4, 6, 10, 11, 12]]
    meta = AttentionMetadata.build(starts, lens, tables, BS, "cpu")
    n = sum(lens)
    q, k, v = torch.randn(1, n, H, D) * 3, torch.randn(1, n, KV, D), torch.randn(1, n, KV, D)
    spec = AttentionSpec((5, None), 0.4, 2.0)
    backend = PagedAttention(kv, meta, spec, cpu_kernel=cpu_path == "c-kernel")
    assert backend.c_kernel == (cpu_path == "c-kernel")
    out = backend(layer, q, k, v)[0]  # [N, H, D]
    row = 0
    for i, (start, new) in enumerate(zip(starts, lens)):  # each sequence's rows against dense attention over its context
        ctx = start + new
        keys, values = (c[torch.tensor(tables[i])].reshape(-1, KV, D)[:ctx].transpose(0, 1)[None] for c in kv[:, layer])
        mask = window_mask(torch.arange(start, ctx), ctx, spec.window(layer))  # [new, ctx]
        want = attend(q[0, row:row + new].transpose(0, 1)[None], keys, values, mask, False, 0.4, 2.0)[0].transpose(0, 1)
        torch.testing.assert_close(out[row:row + new], want, atol=1e-5, rtol=1e-5)
        row += new


def test_context_groups_cover_every_row_once_within_the_slack():
    blocks = [1, 40, 2, 39, 3, 1, 20, 21, 2, 38]
    groups = group_by_context(blocks)
    assert sorted(i for g in groups for i in g) == list(range(len(blocks)))
    for g in groups:
        assert max(blocks[i] for i in g) * len(g) <= GROUP_SLACK * sum(blocks[i] for i in g) or len(g) == 1
    assert len(groups) < len(blocks)  # similar contexts share a call
    assert group_by_context([5, 5, 5]) == [[0, 1, 2]]


def test_decode_rows_of_very_different_contexts_match_the_reference(cpu_path):
    torch.manual_seed(2)
    nb = 64
    kv = torch.randn(2, L, nb, BS, KV, D)
    ctx = [1, 3, 30, 31, 4, 60, 2, 59]  # cached tokens before this step; each row adds one
    perm = torch.randperm(nb).tolist()
    tables, used = [], 0
    for c in ctx:
        n = -(-(c + 1) // BS)
        tables.append(perm[used:used + n])
        used += n
    meta = AttentionMetadata.build(ctx, [1] * len(ctx), tables, BS, "cpu")
    backend = PagedAttention(kv, meta, AttentionSpec(), cpu_kernel=cpu_path == "c-kernel")
    assert 1 < len(backend.groups[None]) < len(ctx) if cpu_path == "torch" else not backend.groups
    q, k, v = torch.randn(1, len(ctx), H, D), torch.randn(1, len(ctx), KV, D), torch.randn(1, len(ctx), KV, D)
    out = backend(0, q, k, v)[0]
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    ref = reference.paged_attention(q[0], kv[0, 0], kv[1, 0], padded, torch.tensor(ctx, dtype=torch.int32) + 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
