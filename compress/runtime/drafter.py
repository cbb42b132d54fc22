"""Drafter: the draft model of speculative decoding, with its own paged KV pool, proposing tokens for
the target's running sequences.

Each target sequence has a shadow sequence here that shares its token list, so the draft tokens it
appends are the ones the target verifies, and the target's accepted tokens are the draft's next
context. The shadow's KV lags behind: a proposal first catches up (prompt, last round's accepted
tokens) in one forward, then decodes one token per round; after the target's step, ``sync`` rolls
the shadow back to the tokens that survived and frees the blocks of those that did not.
"""

from dataclasses import replace
from pathlib import Path

import torch
from torch import nn

from compress.errors import UserError
from compress.models import load_model, load_tokenizer, resolve
from compress.runtime.block_manager import BlockManager
from compress.runtime.config import EngineConfig
from compress.runtime.model_runner import ModelRunner, kv_block_bytes
from compress.runtime.sampler import race, warp
from compress.runtime.scheduler import ScheduledBatch
from compress.runtime.sequence import Sequence, Status
from compress.runtime.speculative import draft_budget


def restrict_head(decoder, n: int) -> None:
    """Score only token ids below n: a draft step's output layer shrinks by V/n. BPE ids are in merge
    order, so low ids are the frequent tokens. Exactness holds: the other tokens get q = 0, and the
    target's correction step still produces them."""
    if not isinstance(decoder.lm_head, nn.Linear):
        raise UserError("--draft-vocab needs a draft model whose lm_head is not quantized")
    weight = decoder.lm_head.weight  # [V, C], maybe tied to the embedding
    if n >= weight.shape[0]:
        return
    decoder.lm_head = nn.Linear(weight.shape[1], n, bias=False, dtype=weight.dtype, device=weight.device)
    decoder.lm_head.weight = nn.Parameter(weight[:n].detach().clone(), requires_grad=False)


class Drafter:
    def __init__(self, model: str | Path, target_tokenizer, vocab_size: int, config: EngineConfig, num_blocks: int,
                 max_model_len: int):
        model_dir = resolve(str(model))
        if load_tokenizer(model_dir).get_vocab() != target_tokenizer.get_vocab():
            raise UserError(f"the draft model {model} has a different tokenizer from the target; "
                            f"speculative decoding needs the same vocabulary")
        decoder = load_model(model_dir, config.torch_dtype, config.device)
        if config.draft_vocab is not None:
            restrict_head(decoder, config.draft_vocab)
        self.k, self.vocab_size = config.num_speculative_tokens, vocab_size  # the target's: drafts are padded or cut to it
        self.max_model_len = min(max_model_len, decoder.cfg.max_position_embeddings)
        # As many blocks as the target's pool: the shadows never hold more tokens than their sequences.
        budget = num_blocks * kv_block_bytes(decoder.cfg, config.block_size, config.torch_dtype)
        self.runner = ModelRunner(decoder, replace(config, kv_cache_memory=budget), self.max_model_len)
        self.blocks = BlockManager(self.runner.num_blocks, config.block_size, config.enable_prefix_caching)
        self.shadows: dict[int, Sequence] = {}  # by target sequence id
        self.targets: dict[int, Sequence] = {}
        self.probs: dict[int, list[torch.Tensor]] = {}  # the draft distribution [V] behind each draft token

    def propose(self, running: list[Sequence]) -> None:
        """Append up to k draft tokens to every running sequence that is decoding (its prompt done)."""
        budget = {s.id: draft_budget(s, self.k, self.max_model_len) for s in running}
        active = [s for s in running if budget[s.id] > 0]
        for seq in active:
            self.probs[seq.id] = []
        for round_ in range(self.k):
            active = [s for s in active if budget[s.id] > round_]
            batch = ScheduledBatch()
            for seq in active:
                shadow = self._shadow(seq)
                num_new = seq.num_tokens - shadow.num_computed
                if not self.blocks.can_append(shadow, num_new):
                    continue  # the draft pool is full: this sequence stops proposing
                batch.add(shadow, num_new, self.blocks.append(shadow, num_new))
            if not batch.seqs:
                return
            logits, _ = self.runner.run(batch)  # [S, Vd]
            active = [self.targets[shadow.id] for shadow in batch.seqs]
            self._extend(active, batch, self._fit(logits, self.vocab_size))

    def draft_probs(self, seq: Sequence) -> torch.Tensor:
        """[num_draft, V]: the distributions seq's current draft tokens were drawn from (sampled requests only)."""
        return torch.stack(self.probs[seq.id][:seq.num_draft]) if seq.num_draft else torch.empty(0)

    def sync(self) -> None:
        """After a target step: free the shadows of sequences no longer running; roll the others back to
        their sequence's verified tokens."""
        for sid, shadow in list(self.shadows.items()):
            seq = self.targets[sid]
            if seq.status is not Status.RUNNING:
                self.blocks.free(shadow)
                del self.shadows[sid], self.targets[sid]
                self.probs.pop(sid, None)
                continue
            shadow.num_computed = min(shadow.num_computed, seq.num_tokens - 1)
            self.blocks.truncate(shadow)
            self.blocks.commit(shadow)

    def _shadow(self, seq: Sequence) -> Sequence:
        if seq.id not in self.shadows:
            params = replace(seq.params, logprobs=None, prompt_logprobs=None, score_from=1)
            shadow = Sequence(seq.id, [], params, frozenset())
            shadow.token_ids = seq.token_ids  # shared on purpose: see the module docstring
            shadow.num_prompt_tokens = seq.num_prompt_tokens
            self.blocks.take_cached_prefix(shadow)
            self.shadows[seq.id], self.targets[seq.id] = shadow, seq
        return self.shadows[seq.id]

    @staticmethod
    def _fit(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """The draft's logits [S, Vd] over the target's vocabulary [S, V] (checkpoints pad vocabularies differently)."""
        if logits.shape[-1] >= vocab_size:
            return logits[:, :vocab_size]
        pad = logits.new_full((logits.shape[0], vocab_size - logits.shape[-1]), float("-inf"))
        return torch.cat([logits, pad], -1)

    def _extend(self, seqs: list[Sequence], batch: ScheduledBatch, logits: torch.Tensor) -> None:
        """Append one draft token to each of seqs from the draft's logits [S, V]: its argmax for a greedy
        request (no distribution needed), else a draw from the warped distribution, which is kept."""
        tokens = logits.argmax(-1).tolist()
        sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
        if sampled:
            probs = warp(logits[sampled], [seqs[i] for i in sampled])  # [S', V]
            for i, q in zip(sampled, probs):
                tokens[i] = race(q, seqs[i].generator)
                self.probs[seqs[i].id].append(q)
        for seq, shadow, n, token in zip(seqs, batch.seqs, batch.num_new_tokens, tokens):
            shadow.num_computed += n
            seq.token_ids.append(token)
            seq.num_draft += 1
