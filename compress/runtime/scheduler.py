"""Iteration-level scheduling (Orca) over a paged KV pool: decides what runs each step, never touches tensors.

Each step first gives every running sequence its next tokens (one for a decode, the next chunk
for a prompt being prefilled in chunks), oldest first; when the pool runs out of blocks the
newest running sequence is preempted: its blocks are freed and it goes back to the front of the
waiting queue, to be recomputed (prompt + output so far) later. Then, if nothing was preempted,
waiting sequences are admitted in arrival order while the token budget, the sequence limit and
the pool allow; a prompt longer than the remaining budget is prefilled in chunks.

With speculative decoding a decoding sequence arrives with draft tokens appended; it is scheduled
with all of them (the target scores every draft in the same forward) unless the budget or the pool
is short, in which case drafts are dropped before anything is preempted.
"""

from collections import deque
from dataclasses import dataclass, field

from compress.runtime.block_manager import BlockManager
from compress.runtime.config import EngineConfig
from compress.runtime.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens of each seq computed this step
    copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) KV block copies, before the forward

    def add(self, seq: Sequence, num_new: int, copies: list[tuple[int, int]]) -> None:
        self.seqs.append(seq)
        self.num_new_tokens.append(num_new)
        self.copies += copies

    def samples(self, i: int) -> bool:
        """Whether seq i reaches its last token this step (so its last logits are sampled)."""
        return self.seqs[i].num_computed + self.num_new_tokens[i] == self.seqs[i].num_tokens

    def num_sample_rows(self, i: int) -> int:
        """Trailing rows of seq i whose logits are needed: the last token's and one per draft token."""
        return 1 + self.seqs[i].num_draft if self.samples(i) else 0

    def prompt_logprob_rows(self) -> list[tuple[int, int, int]]:
        """(seq index, first position, count): the rows of this step whose logits score a prompt token.

        Position p's logits give the log-probability of token p + 1, so a prompt of P tokens is
        scored by positions score_from - 1 .. P - 2, whichever of them this step computes.
        """
        spans = []
        for i, (seq, n) in enumerate(zip(self.seqs, self.num_new_tokens)):
            start = max(seq.num_computed, seq.params.score_from - 1)
            end = min(seq.num_computed + n, seq.num_prompt_tokens - 1)
            if seq.params.prompt_logprobs is not None and end > start:
                spans.append((i, start, end - start))
        return spans


class Scheduler:
    def __init__(self, config: EngineConfig, blocks: BlockManager, max_model_len: int):
        self.config, self.blocks, self.max_model_len = config, blocks, max_model_len
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []  # oldest first
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.config.max_num_batched_tokens
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            seq.keep_draft(budget - 1)
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            while not self.blocks.can_append(seq, num_new):
                if seq.num_draft:
                    seq.keep_draft(0)
                    num_new = seq.num_tokens - seq.num_computed
                    continue
                preempted = True
                self._preempt(self.running[-1])
                if seq.status is not Status.RUNNING:
                    break
            if seq.status is Status.RUNNING:
                batch.add(seq, num_new, self.blocks.append(seq, num_new))
                budget -= num_new
                i += 1
        for seq in self.running[i:]:  # out of budget this step: their drafts would go stale
            seq.keep_draft(0)
        if not preempted:
            self._admit(batch, budget)
        return batch

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            self.blocks.take_cached_prefix(seq)
            num_new = min(seq.num_tokens - seq.num_computed, budget)
            if not self.blocks.can_append(seq, num_new):
                self.blocks.undo_prefix(seq)
                return
            batch.add(seq, num_new, self.blocks.append(seq, num_new))
            budget -= num_new
            self.waiting.popleft()
            self.running.append(seq)
            seq.status = Status.RUNNING

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.keep_draft(0)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def postprocess(self, batch: ScheduledBatch, sampled: list[list[int]]) -> None:
        """Account for a finished step. sampled[j] is what the j-th sampling seq of the batch gained: its
        accepted draft tokens (a prefix of its drafts), then one token sampled by the target."""
        tokens = iter(sampled)
        for i, seq in enumerate(batch.seqs):
            samples = batch.samples(i)
            seq.num_computed += batch.num_new_tokens[i]
            if samples:
                self._take(seq, next(tokens))
            else:
                self.blocks.commit(seq)

    def _take(self, seq: Sequence, new_tokens: list[int]) -> None:
        """Replace seq's drafts by new_tokens, up to the first that ends the sequence. Every token but the
        last now has its K/V in the cache (the drafts were computed this step); blocks past them are freed."""
        seq.keep_draft(0)
        reason = None
        for token in new_tokens:
            seq.token_ids.append(token)
            reason = self._finish_reason(seq)
            if reason:
                break
        seq.num_computed = seq.num_tokens - 1
        self.blocks.truncate(seq)
        self.blocks.commit(seq)
        if reason:
            self.finish(seq, reason)

    def _finish_reason(self, seq: Sequence) -> str | None:
        if seq.token_ids[-1] in seq.stop_ids:
            return "stop"
        if seq.num_output_tokens >= seq.params.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def finish(self, seq: Sequence, reason: str) -> None:
        """Take seq out of the queues and free its blocks (end of generation, stop string, abort)."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.blocks.free(seq)
        seq.status, seq.finish_reason = Status.FINISHED, reason
