"""Paged KV blocks: allocation, ref counts, prefix caching by chained block hashes, copy-on-write.

A block holds ``block_size`` consecutive tokens of one or more sequences. A full block whose
K/V has been computed is registered under the hash of its tokens chained with the hash of the
block before it, so a later request with the same prefix maps the same physical block
(ref_count > 1) instead of computing it again. A freed block keeps its hash and stays findable
until the pool hands it out again (oldest freed first), so "free" includes cached-but-unused.

A prompt that ends inside a block (the four MMLU answers after one question, a system prompt whose
length is not a multiple of block_size) can also reuse the *leading slots* of a cached block:
every computed block registers its first 1 .. block_size - 1 tokens as partial keys, and a new
sequence maps the longest match after its full blocks. A block is never written where cached
content (its full hash, or partial keys longer than the write's slot) or another sequence still
needs it: it is copied first, so a key always describes what the slots hold.
"""

from collections import OrderedDict
from dataclasses import dataclass, field

from compress.runtime.sequence import Sequence


@dataclass
class Block:
    id: int
    ref_count: int = 0
    hash: int | None = None
    token_ids: tuple[int, ...] = ()  # the tokens behind `hash`, compared on a hit
    partial_keys: list[tuple] = field(default_factory=list)  # (prev hash, leading tokens), shortest first


def chain_hash(prev: int | None, token_ids: tuple[int, ...]) -> int:
    return hash((prev, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = True):
        self.block_size, self.prefix_caching = block_size, prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # eviction order
        self.cached: dict[int, int] = {}  # block hash -> block id
        self.partial: dict[tuple, int] = {}  # (prev hash, the block's first n < block_size tokens) -> block id
        # Counters for tests and benchmarks.
        self.num_allocated = 0  # blocks handed out fresh (not prefix hits)
        self.num_prefix_hits = 0  # blocks reused through the prefix cache
        self.num_partial_hits = 0  # of which blocks whose leading slots only were reused
        self.num_cow_copies = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_ids)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def take_cached_prefix(self, seq: Sequence) -> None:
        """Map the leading blocks of a new sequence that are in the prefix cache; sets num_computed.

        Full blocks first, then the longest cached run of leading slots of the next block. At least
        one token is left to compute (its logits are needed): when the whole prompt is cached, the
        last token is recomputed, and its write into the shared block copies it first. Only the
        first seq.max_cached_tokens tokens are looked up (prompt tokens to score need their logits).
        """
        if not self.prefix_caching:
            return
        bs, limit, prev = self.block_size, seq.max_cached_tokens, None
        for start in range(0, limit - bs + 1, bs):
            tokens = tuple(seq.token_ids[start:start + bs])
            h = chain_hash(prev, tokens)
            block_id = self.cached.get(h)
            if block_id is None or self.blocks[block_id].token_ids != tokens:
                break
            self._ref(block_id)
            seq.block_table.append(block_id)
            seq.block_hashes.append(h)
            prev = h
        cached = len(seq.block_table) * bs
        self.num_prefix_hits += len(seq.block_table)
        # A match must leave the last prompt token to compute, or it reuses nothing (and costs a copy).
        for n in range(min(bs - 1, limit - cached, seq.num_tokens - 1 - cached), 0, -1):
            block_id = self.partial.get((prev, tuple(seq.token_ids[cached:cached + n])))
            if block_id is not None:
                self._ref(block_id)
                seq.block_table.append(block_id)
                self.num_prefix_hits += 1
                self.num_partial_hits += 1
                cached += n
                break
        seq.num_computed = min(cached, seq.num_tokens - 1)

    def undo_prefix(self, seq: Sequence) -> None:
        """Give back what take_cached_prefix mapped, for a sequence that could not be admitted after all."""
        self.num_prefix_hits -= len(seq.block_table)
        self.num_partial_hits -= len(seq.block_table) - len(seq.block_hashes)
        self.free(seq)

    def can_append(self, seq: Sequence, num_new: int) -> bool:
        return self._new_blocks(seq, num_new) <= self.num_free

    def append(self, seq: Sequence, num_new: int) -> list[tuple[int, int]]:
        """Give seq room for num_new more tokens; returns (src, dst) block copies to make first."""
        copies = self._copy_on_write(seq)
        for _ in range(self.blocks_needed(seq.num_computed + num_new) - len(seq.block_table)):
            seq.block_table.append(self._allocate())
        return copies

    def commit(self, seq: Sequence) -> None:
        """Register the newly completed full blocks of seq (their K/V now computed) in the prefix cache,
        and the leading slots of every block computed since the last commit as partial keys."""
        if not self.prefix_caching:
            return
        bs = self.block_size
        first = len(seq.block_hashes)
        for i in range(first, seq.num_computed // bs):
            tokens = tuple(seq.token_ids[i * bs:(i + 1) * bs])
            h = chain_hash(seq.block_hashes[-1] if seq.block_hashes else None, tokens)
            seq.block_hashes.append(h)
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids = h, tokens
            self.cached.setdefault(h, block.id)
        for i in range(first, -(-seq.num_computed // bs)):
            self._register_partial(seq, i, min(seq.num_computed - i * bs, bs - 1))

    def _register_partial(self, seq: Sequence, index: int, n: int) -> None:
        """Keys for the first 1..n slots of seq's block at ``index`` (those not registered yet)."""
        block = self.blocks[seq.block_table[index]]
        prev = seq.block_hashes[index - 1] if index else None
        start = index * self.block_size
        for length in range(len(block.partial_keys) + 1, n + 1):
            key = (prev, tuple(seq.token_ids[start:start + length]))
            block.partial_keys.append(key)
            self.partial.setdefault(key, block.id)

    def _hash_is_cached(self, block: Block) -> bool:
        """Whether the prefix cache finds this block under its full hash (another may hold the same tokens)."""
        return block.hash is not None and self.cached.get(block.hash) == block.id

    def _forget(self, block: Block) -> None:
        """Unregister block's full hash and partial keys (it is about to hold other tokens)."""
        if self._hash_is_cached(block):
            del self.cached[block.hash]
        block.hash, block.token_ids = None, ()
        for key in block.partial_keys:
            if self.partial.get(key) == block.id:
                del self.partial[key]
        block.partial_keys.clear()

    def free(self, seq: Sequence) -> None:
        self._release(seq.block_table)
        seq.block_table = []
        seq.block_hashes = []
        seq.num_computed = 0

    def truncate(self, seq: Sequence) -> None:
        """Free the blocks past what seq's tokens need (those held for rejected draft tokens)."""
        keep = self.blocks_needed(seq.num_tokens)
        self._release(seq.block_table[keep:])
        del seq.block_table[keep:]

    def _release(self, block_ids: list[int]) -> None:
        # Tail blocks first, so that when the pool evicts, a shared prefix outlives the suffixes.
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_ids[block_id] = None

    def _new_blocks(self, seq: Sequence, num_new: int) -> int:
        grow = max(self.blocks_needed(seq.num_computed + num_new) - len(seq.block_table), 0)
        index = self._shared_write_target(seq)
        # A copy needs a block of its own only while others hold the source; a source only the cache
        # wants goes back to the pool first (see _copy_on_write).
        return grow + (1 if index is not None and self.blocks[seq.block_table[index]].ref_count > 1 else 0)

    def _shared_write_target(self, seq: Sequence) -> int | None:
        """Index in the block table of the block the next write lands in, if it must be copied first:
        another sequence reads it, or its cached content reaches past the write (a block mapped by a
        partial hit). A block of seq's own hashed prefix is rewritten with the same tokens (a fully
        cached prompt recomputing its last one), so only sharing counts there."""
        index, offset = divmod(seq.num_computed, self.block_size)
        if index >= len(seq.block_table):
            return None
        block = self.blocks[seq.block_table[index]]
        cached_past = index >= len(seq.block_hashes) and (len(block.partial_keys) > offset or self._hash_is_cached(block))
        return index if block.ref_count > 1 or cached_past else None

    def _copy_on_write(self, seq: Sequence) -> list[tuple[int, int]]:
        index = self._shared_write_target(seq)
        if index is None:
            return []
        src = seq.block_table[index]
        self._release([src])
        dst = seq.block_table[index] = self._allocate()
        if dst == src:  # the pool's only free block: written in place, its cached keys forgotten
            return []
        self.num_cow_copies += 1
        return [(src, dst)]

    def _ref(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
        block.ref_count += 1

    def _allocate(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        self._forget(block)
        block.ref_count = 1
        self.num_allocated += 1
        return block_id
