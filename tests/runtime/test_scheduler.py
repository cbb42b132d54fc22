from compress.runtime.block_manager import BlockManager
from compress.runtime.config import EngineConfig
from compress.runtime.scheduler import Scheduler
from compress.runtime.sequence import SamplingParams, Sequence, Status


def scheduler(num_blocks=64, **config):
    cfg = EngineConfig(block_size=4, device="cpu", **config)
    return Scheduler(cfg, BlockManager(num_blocks, 4), max_model_len=1000)


def add(sched, i, n, max_tokens=100):
    s = Sequence(i, list(range(i * 1000, i * 1000 + n)), SamplingParams(max_tokens=max_tokens), frozenset())
    sched.add(s)
    return s


def step(sched):
    """Schedule, then account for it as the engine would, sampling token 7 where a sequence samples."""
    batch = sched.schedule()
    plan = {s.id: n for s, n in zip(batch.seqs, batch.num_new_tokens)}
    sched.postprocess(batch, [[7]] * sum(batch.samples(i) for i in range(len(batch.seqs))))
    return plan


def test_prefill_and_decode_share_a_step_within_the_budget():
    sched = scheduler(max_num_batched_tokens=10)
    a = add(sched, 0, 6)
    assert step(sched) == {0: 6}
    add(sched, 1, 20)
    assert step(sched) == {0: 1, 1: 9}  # a decodes, b's prompt is chunked to the budget left
    assert step(sched) == {0: 1, 1: 9}
    assert step(sched) == {0: 1, 1: 2}  # b's last chunk samples its first token
    assert a.num_output_tokens == 4 and sched.running[1].num_output_tokens == 1


def test_max_num_seqs_limits_running():
    sched = scheduler(max_num_seqs=2)
    for i in range(3):
        add(sched, i, 3)
    assert step(sched) == {0: 3, 1: 3}
    assert [s.id for s in sched.waiting] == [2]


def test_newest_is_preempted_and_recomputed_with_its_output():
    sched = scheduler(num_blocks=4)
    a, b = add(sched, 0, 8), add(sched, 1, 8)  # 2 blocks each: the pool is full
    assert step(sched) == {0: 8, 1: 8}
    plan = step(sched)  # both need a third block: b (newest) is preempted, a continues
    assert plan == {0: 1} and sched.num_preemptions == 1
    assert b.status is Status.WAITING and sched.waiting[0] is b and b.num_computed == 0 and b.block_table == []
    assert b.token_ids[-1] == 7 and b.num_tokens == 9  # its sampled token is kept, to be recomputed
    sched.finish(a, "stop")
    # Prompt + output so far are prefilled again; b's first block survived in the prefix cache
    # (its tail block was freed first and so evicted first, when a took its third block).
    assert step(sched) == {1: 5} and sched.blocks.num_prefix_hits == 1


def test_running_sequences_come_first_and_the_last_one_preempts_itself():
    sched = scheduler(num_blocks=3)
    a = add(sched, 0, 8)
    step(sched)
    b = add(sched, 1, 3)
    step(sched)  # a's decode takes the last block (slot 8 is in block 3): b cannot be admitted
    assert b.status is Status.WAITING
    for _ in range(3):
        step(sched)
    assert a.status is Status.RUNNING and a.num_computed == 12 and len(a.block_table) == 3
    step(sched)  # a needs a 4th block and is alone: it preempts itself
    assert a.status is Status.WAITING and sched.num_preemptions == 1


def test_finished_sequences_free_their_blocks():
    sched = scheduler()
    a = add(sched, 0, 5, max_tokens=2)
    step(sched)
    step(sched)
    assert a.finished and a.finish_reason == "length" and sched.blocks.num_free == 64
    assert not sched.has_unfinished()


def draft(seq, tokens):
    seq.token_ids += tokens
    seq.num_draft = len(tokens)


def test_drafts_are_scheduled_with_their_sequence_and_cut_to_the_budget():
    sched = scheduler(max_num_batched_tokens=4)
    a = add(sched, 0, 3)
    step(sched)  # prefill; a now decodes
    draft(a, [1, 2, 3, 4, 5])
    batch = sched.schedule()
    assert batch.num_new_tokens == [4] and a.num_draft == 3 and batch.num_sample_rows(0) == 4


def test_postprocess_keeps_accepted_drafts_and_frees_the_blocks_of_rejected_ones():
    sched = scheduler()
    a = add(sched, 0, 7)
    step(sched)  # 7 prompt tokens + 1 sampled: 8 tokens, 7 computed, 2 blocks of 4
    draft(a, [11, 12, 13, 14, 15])  # 13 tokens: 4 blocks
    batch = sched.schedule()
    assert len(a.block_table) == 4
    sched.postprocess(batch, [[11, 12, 99]])  # two accepted, the third corrected
    assert a.output_token_ids == [7, 11, 12, 99] and a.num_draft == 0
    assert a.num_computed == 10 and len(a.block_table) == 3
    assert sched.blocks.num_free == 64 - 3


def test_a_stop_token_among_accepted_drafts_finishes_there():
    sched = scheduler()
    a = add(sched, 0, 3, max_tokens=100)
    a.stop_ids = frozenset({12})
    step(sched)
    draft(a, [11, 12, 13])
    sched.postprocess(sched.schedule(), [[11, 12, 13, 14]])
    assert a.output_token_ids == [7, 11, 12] and a.finish_reason == "stop"
    assert sched.blocks.num_free == 64


def test_drafts_go_before_anything_is_preempted():
    sched = scheduler(num_blocks=3)
    a = add(sched, 0, 4)
    add(sched, 1, 3)
    step(sched)  # a: 5 tokens, b: 4, one block each so far; a's next token takes the last free block
    draft(a, [1, 2, 3, 4])  # with these a would need two more
    batch = sched.schedule()
    assert a.num_draft == 0 and batch.num_new_tokens == [1, 1] and sched.num_preemptions == 0
