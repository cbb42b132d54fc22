"""Scheduler + BlockManager against a symbolic KV cache: every slot records the token prefix whose K/V
it holds, so a read of anything else (a stale slot, another sequence's token, a missed copy) fails.

Random workloads of shared and private prompts with prefix caching (full and partial blocks),
chunked prefill, preemption, aborts, stops, prompt scoring and speculative drafts with random
rejections; after every step the ref counts, the free list and every cached key are checked.
"""

import random
from collections import Counter

import pytest

from compress.runtime.block_manager import BlockManager, chain_hash
from compress.runtime.config import EngineConfig
from compress.runtime.scheduler import Scheduler
from compress.runtime.sequence import SamplingParams, Sequence

VOCAB = 3  # few token ids, so prompts share prefixes often


class SymbolicKV:
    def __init__(self, block_size: int):
        self.bs = block_size
        self.slots: dict[tuple[int, int], tuple[int, ...]] = {}  # (block, slot) -> tokens[:p + 1]

    def forward(self, batch) -> None:
        """The runner's order: block copies, then every write, then every read is checked."""
        snapshot = {(s, j): self.slots.get((s, j)) for s, _ in batch.copies for j in range(self.bs)}
        for src, dst in batch.copies:
            for j in range(self.bs):
                self.slots[(dst, j)] = snapshot[(src, j)]
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            for p in range(seq.num_computed, seq.num_computed + n):
                self.slots[self.where(seq, p)] = tuple(seq.token_ids[:p + 1])
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            for p in range(seq.num_computed + n):
                assert self.slots.get(self.where(seq, p)) == tuple(seq.token_ids[:p + 1]), f"seq {seq.id} reads a wrong slot at {p}"

    def where(self, seq: Sequence, p: int) -> tuple[int, int]:
        return seq.block_table[p // self.bs], p % self.bs


def check_pool(bm: BlockManager, kv: SymbolicKV, holders: list[Sequence]) -> None:
    refs = Counter(b for s in holders for b in s.block_table)
    for block in bm.blocks:
        assert block.ref_count == refs.get(block.id, 0)
        assert (block.ref_count == 0) == (block.id in bm.free_ids)
    bs = bm.block_size

    def chain(tokens: tuple[int, ...]) -> int | None:
        h = None
        for i in range(0, len(tokens), bs):
            h = chain_hash(h, tokens[i:i + bs])
        return h

    for h, block_id in bm.cached.items():
        last = kv.slots.get((block_id, bs - 1))
        assert last is not None and len(last) % bs == 0 and chain(last) == h
    for (prev, tokens), block_id in bm.partial.items():
        held = kv.slots.get((block_id, len(tokens) - 1))
        start = len(held) - len(tokens)
        assert start % bs == 0 and held[start:] == tokens and chain(held[:start]) == prev


def step(sched: Scheduler, kv: SymbolicKV, r: random.Random) -> list[Sequence]:
    """One engine step with random sampled tokens and accepted drafts; returns the batch's sequences."""
    batch = sched.schedule()
    if batch.seqs:
        kv.forward(batch)
        sampled = []
        for i, seq in enumerate(batch.seqs):
            if batch.samples(i):
                drafts = seq.token_ids[seq.num_tokens - seq.num_draft:]
                sampled.append(drafts[:r.randint(0, len(drafts))] + [r.randrange(VOCAB)])
        sched.postprocess(batch, sampled)
    return batch.seqs


def simulate(seed: int, speculative: bool, steps: int = 150) -> BlockManager:
    r = random.Random(seed)
    bs, num_blocks = r.choice([2, 3, 4]), r.randint(6, 30)
    cfg = EngineConfig(block_size=bs, device="cpu", max_num_batched_tokens=r.randint(3, 24), max_num_seqs=r.randint(1, 5))
    bm = BlockManager(num_blocks, bs)
    sched, kv = Scheduler(cfg, bm, max_model_len=10_000), SymbolicKV(bs)
    bases = [[r.randrange(VOCAB) for _ in range(30)] for _ in range(2)]
    seqs = []
    for _ in range(steps):
        if r.random() < 0.4 and len(sched.waiting) < 4:
            n = r.randint(1, min(3 * bs + 2, num_blocks * bs - 7))
            base = r.choice(bases)
            tokens = base[:n] if r.random() < 0.7 else base[:r.randint(0, n - 1)] + [r.randrange(VOCAB)]
            scoring = {"prompt_logprobs": 0, "score_from": r.randint(1, len(tokens) + 3)} if r.random() < 0.2 else {}
            seqs.append(Sequence(len(seqs), tokens, SamplingParams(max_tokens=r.randint(1, 6), ignore_eos=True, **scoring), frozenset()))
            sched.add(seqs[-1])
        if speculative:  # what the drafter does: append draft tokens to decoding sequences
            for seq in sched.running:
                if seq.num_computed == seq.num_tokens - 1:
                    k = r.randint(0, 3)
                    seq.token_ids += [r.randrange(VOCAB) for _ in range(k)]
                    seq.num_draft = k
        for seq in step(sched, kv, r):
            if not seq.finished and r.random() < 0.03:
                sched.finish(seq, "stop")
        live = [s for s in seqs if not s.finished]
        if live and r.random() < 0.05:
            sched.finish(r.choice(live), "abort")
        check_pool(bm, kv, sched.running)
    for _ in range(200):  # no new requests: everything admitted must run to its end (no livelock)
        step(sched, kv, r)
        check_pool(bm, kv, sched.running)
    assert not sched.has_unfinished()
    assert bm.num_free == bm.num_blocks
    return bm


@pytest.mark.parametrize("speculative", [False, True])
def test_every_read_sees_its_own_tokens_and_the_pool_stays_consistent(speculative):
    hits = Counter()
    for seed in range(40):
        bm = simulate(seed, speculative)
        hits.update(full=bm.num_prefix_hits - bm.num_partial_hits, partial=bm.num_partial_hits, copies=bm.num_cow_copies)
    assert min(hits.values()) > 100  # the workloads do exercise full hits, partial hits and copies
