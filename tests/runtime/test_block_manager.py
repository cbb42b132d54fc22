from compress.runtime.block_manager import BlockManager
from compress.runtime.sequence import SamplingParams, Sequence


def seq(tokens, i=0):
    return Sequence(i, list(tokens), SamplingParams(), frozenset())


def compute(bm: BlockManager, s: Sequence, n: int) -> list:
    """What the scheduler and runner do for one step of n tokens."""
    copies = bm.append(s, n)
    s.num_computed += n
    bm.commit(s)
    return copies


def test_append_allocates_whole_blocks_and_free_returns_them():
    bm = BlockManager(8, 4)
    s = seq(range(10))
    assert bm.can_append(s, 10)
    compute(bm, s, 10)
    assert len(s.block_table) == 3 and bm.num_free == 5 and bm.num_allocated == 3
    s.token_ids.append(99)
    compute(bm, s, 1)  # slot 10 is in block 2: nothing new
    assert len(s.block_table) == 3
    s.token_ids += [1, 2]
    compute(bm, s, 2)  # tokens 11, 12: block 3
    assert len(s.block_table) == 4
    bm.free(s)
    assert bm.num_free == 8 and s.block_table == [] and s.num_computed == 0
    assert not bm.can_append(seq(range(40)), 40)


def test_prefix_hit_shares_full_blocks_with_chained_hashes():
    bm = BlockManager(16, 4)
    a = seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    compute(bm, a, 9)
    b = seq([1, 2, 3, 4, 5, 6, 7, 8, 0, 0], 1)
    bm.take_cached_prefix(b)
    assert b.block_table == a.block_table[:2] and b.num_computed == 8 and bm.num_prefix_hits == 2
    assert all(bm.blocks[i].ref_count == 2 for i in b.block_table)
    # The same second block after another first block is a different prefix: only block 0's
    # first three slots are reused.
    c = seq([1, 2, 3, 0, 5, 6, 7, 8, 9], 2)
    bm.take_cached_prefix(c)
    assert c.block_table == a.block_table[:1] and c.num_computed == 3 and bm.num_partial_hits == 1


def test_freed_blocks_stay_cached_until_reused():
    bm = BlockManager(4, 4)
    a = seq(range(8))
    compute(bm, a, 8)
    bm.free(a)
    assert bm.num_free == 4
    b = seq(list(range(8)) + [50], 1)
    bm.take_cached_prefix(b)
    assert b.num_computed == 8 and bm.num_free == 2
    bm.free(b)
    filler = seq(range(100, 116), 2)  # takes every block: the cached ones are evicted
    compute(bm, filler, 16)
    bm.free(filler)
    c = seq(list(range(8)) + [50], 3)
    bm.take_cached_prefix(c)
    assert c.num_computed == 0


def test_fully_cached_prompt_copies_the_shared_block_before_writing():
    bm = BlockManager(8, 4)
    a = seq(range(8))
    compute(bm, a, 8)
    b = seq(range(8), 1)
    bm.take_cached_prefix(b)
    assert b.num_computed == 7  # the last token is recomputed for its logits
    shared = b.block_table[1]
    copies = compute(bm, b, 1)
    assert copies == [(shared, b.block_table[1])] and b.block_table[1] != shared
    assert bm.blocks[shared].ref_count == 1 and bm.num_cow_copies == 1
    bm.free(a)
    bm.free(b)
    assert bm.num_free == 8


def test_undo_prefix_restores_counters():
    bm = BlockManager(8, 4)
    a = seq(range(8))
    compute(bm, a, 8)
    b = seq(range(12), 1)
    bm.take_cached_prefix(b)
    bm.undo_prefix(b)
    assert bm.num_prefix_hits == 0 and b.block_table == [] and bm.num_free == 6


def test_prefix_caching_off_never_hits():
    bm = BlockManager(8, 4, prefix_caching=False)
    a = seq(range(8))
    compute(bm, a, 8)
    b = seq(range(9), 1)
    bm.take_cached_prefix(b)
    assert b.num_computed == 0 and bm.cached == {}


def test_leading_slots_of_a_shared_block_are_reused_and_copied_before_writing():
    bm = BlockManager(16, 4)
    a = seq(range(10))
    compute(bm, a, 10)
    b = seq([0, 1, 2, 3, 4, 5, 77, 78], 1)  # block 0 whole, then the first 2 slots of block 1
    bm.take_cached_prefix(b)
    assert b.block_table == a.block_table[:2] and b.num_computed == 6
    assert (bm.num_prefix_hits, bm.num_partial_hits) == (2, 1)
    shared = a.block_table[1]
    copies = compute(bm, b, 2)
    assert copies == [(shared, b.block_table[1])] and b.block_table[1] != shared
    assert bm.blocks[shared].ref_count == 1


def test_a_partial_hit_copies_the_block_so_its_cached_content_survives():
    bm = BlockManager(16, 4)
    a = seq(range(10))
    compute(bm, a, 10)
    a_blocks = list(a.block_table)
    bm.free(a)  # nobody holds a's blocks: only the cache does
    b = seq([0, 1, 2, 3, 4, 5, 77, 78], 1)
    bm.take_cached_prefix(b)
    assert b.block_table == a_blocks[:2] and b.num_computed == 6
    copies = compute(bm, b, 2)  # slots 2, 3 of that block hold a's tokens 6, 7: copied, not overwritten
    assert copies == [(a_blocks[1], b.block_table[1])] and b.block_table[1] != a_blocks[1]
    bm.free(b)
    c = seq(list(range(10)) + [50], 2)  # a's prompt again: every block of it is still cached
    bm.take_cached_prefix(c)
    assert c.block_table == a_blocks and c.num_computed == 10
    d = seq([0, 1, 2, 3, 4, 5, 77, 78, 9], 3)  # and b's tokens are cached in b's copy
    bm.take_cached_prefix(d)
    assert d.num_computed == 8 and d.block_table[1] == copies[0][1]


def test_a_partial_hit_that_would_reuse_no_slot_is_not_taken():
    bm = BlockManager(16, 4)
    a = seq(range(6))
    compute(bm, a, 6)
    b = seq([0, 1, 2, 3, 4], 1)  # ends one slot into a's block 1, and its last token must be computed
    bm.take_cached_prefix(b)
    assert b.block_table == a.block_table[:1] and b.num_computed == 4 and bm.num_partial_hits == 0
    assert compute(bm, b, 1) == []  # a fresh block: nothing copied


def test_answer_choices_after_one_context_compute_only_their_own_tokens():
    """lm-eval's four continuations of one question: the first computes the context, the others reuse
    all of it but the last context token, whose logits score their continuation."""
    bm = BlockManager(16, 4)
    context = list(range(100, 110))
    first = Sequence(0, context + [1], SamplingParams(prompt_logprobs=1, score_from=10), frozenset())
    compute(bm, first, 11)
    bm.free(first)
    for i, answer in enumerate([2, 3, 4], 1):
        s = Sequence(i, context + [answer], SamplingParams(prompt_logprobs=1, score_from=10), frozenset())
        bm.take_cached_prefix(s)
        assert s.num_computed == 9
        compute(bm, s, 2)
        bm.free(s)
    assert bm.num_partial_hits == 3


def test_a_partial_hit_fits_a_pool_that_the_same_prompt_fits_without_it():
    bm = BlockManager(3, 4)
    a = seq(range(8))
    compute(bm, a, 8)
    bm.free(a)
    b = seq([0, 1, 2, 3, 4, 5, 77, 78, 79, 80, 81, 82], 1)  # 3 blocks: the whole pool
    bm.take_cached_prefix(b)
    assert b.num_computed == 6 and bm.num_free == 1
    # The copy's source is only cached, not held: it goes back to the pool before the copy is made.
    assert bm.can_append(b, 6)
    copies = compute(bm, b, 6)
    assert len(copies) == 1 and len(set(b.block_table)) == 3 and bm.num_free == 0
