"""The batch sweep of `compress bench` and the bytes a decode step reads, on the tiny model (hand counts)."""

import pytest

from compress.errors import UserError
from compress.runtime import LLM
from compress.bench.footprint import footprint
from compress.bench.sweep import SweepConfig, parse_batch_sizes, sweep

V, C, I, L, KVH, D = 49152, 64, 128, 2, 2, 16  # tiny_dir: vocab, hidden, MLP, layers, KV heads, head_dim
LINEARS = [(C, C), (KVH * D, C), (KVH * D, C), (C, C), (I, C), (I, C), (C, I)]  # (out, in): q k v o gate up down


def dense_step_bytes() -> int:
    """fp32: the tied embedding (read whole by the lm_head), every layer's Linears and norms, the final norm."""
    return 4 * (V * C + L * (sum(o * i for o, i in LINEARS) + 2 * C) + C)


def packed_bytes(out: int, inp: int, g: int = 64) -> int:
    """int4 PackedLinear: codes (8 per int32), fp32 scales, int32 zero points packed along out, int64 weight_shape."""
    return out * inp // 2 + out * (inp // g) * 4 + -(-out // 8) * (inp // g) * 4 + 2 * 8


def nibble_bytes(out: int, inp: int, g: int = 64) -> int:
    """int4 on the CPU path (NibbleLinear): codes half a byte each, fp32 scale and offset per group."""
    return out * inp // 2 + 2 * out * (inp // g) * 4


def test_footprint_is_a_hand_count(tiny_dir):
    fp = footprint(LLM(tiny_dir, kv_cache_memory=1 << 20), tiny_dir)
    assert fp.read == fp.stored == dense_step_bytes()
    assert fp.kv_per_token == 2 * L * KVH * D * 4  # K and V, every layer, fp32
    assert fp.step_bytes(8, 100) == dense_step_bytes() + 8 * 100 * fp.kv_per_token


def test_int4_is_counted_packed_as_stored_and_in_4_bit_panels_as_the_cpu_path_reads_it(tiny_int4_dir):
    fp = footprint(LLM(tiny_int4_dir, kv_cache_memory=1 << 20), tiny_int4_dir)
    assert fp.stored == 4 * (V * C + L * 2 * C + C) + L * sum(packed_bytes(o, i) for o, i in LINEARS)
    dense_linears = 4 * L * sum(o * i for o, i in LINEARS)
    assert fp.read == dense_step_bytes() - dense_linears + L * sum(nibble_bytes(o, i) for o, i in LINEARS)
    assert fp.step_bytes(2, 10, stored=True) == fp.stored + 2 * 10 * fp.kv_per_token


def test_sweep_gives_every_batch_size_its_tokens_without_preemption(tiny_dir):
    cfg = SweepConfig((1, 3), prompt_len=8, new_tokens=5, repeats=2)
    llm = LLM(tiny_dir, kv_cache_memory=cfg.kv_cache_bytes(2 * L * KVH * D * 4))
    rows = sweep(llm, cfg)
    assert [(r.batch, r.tokens, r.preemptions) for r in rows] == [(1, 5, 0), (3, 15, 0)]
    assert all(r.decode_tok_s > 0 and r.ttft50 > 0 and r.itl50 <= r.itl99 and r.peak_rss > 0 for r in rows)
    assert llm.blocks.num_blocks == 3  # the pool holds the largest batch: 3 requests of 13 tokens, one block each


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(batch_sizes=(1, 0)), "--batch-sizes"), (dict(batch_sizes=()), "--batch-sizes"),
    (dict(prompt_len=0), "--prompt-len"), (dict(new_tokens=1), "--new-tokens"), (dict(repeats=0), "--repeats"),
])
def test_bad_sweep_settings(kwargs, fragment):
    with pytest.raises(UserError, match=fragment):
        SweepConfig(**kwargs)


def test_batch_sizes_are_parsed():
    assert parse_batch_sizes("1,8,32") == (1, 8, 32)
    with pytest.raises(UserError, match="comma-separated"):
        parse_batch_sizes("1,eight")
