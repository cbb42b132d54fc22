"""LLM: the engine's public face. Glue only: tokenizer -> scheduler -> model runner -> sampler."""

from collections.abc import Iterator
from itertools import count
from pathlib import Path

import torch

from compress.errors import UserError
from compress.kernels import int8_rows_cpu
from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.manifest import read_manifest
from compress.models import check_tokenizer, checkpoint_dtype, load_model, load_tokenizer, resolve
from compress.runtime.block_manager import BlockManager
from compress.runtime.config import EngineConfig
from compress.runtime.detokenizer import Detokenizer
from compress.runtime.drafter import Drafter
from compress.runtime.logprobs import token_logprobs
from compress.runtime.model_runner import ModelRunner
from compress.runtime.ngram_drafter import NGRAM, NgramDrafter
from compress.runtime.output import RequestOutput
from compress.runtime.sampler import Sampler, warp
from compress.runtime.scheduler import Scheduler
from compress.runtime.sequence import SamplingParams, Sequence
from compress.runtime.speculative import SpecStats, accept, accept_greedy

Prompt = str | list[int]


def eos_ids(model_eos, tokenizer) -> frozenset[int]:
    ids = set(model_eos if isinstance(model_eos, list) else [model_eos])
    ids.add(tokenizer.eos_token_id)
    return frozenset(i for i in ids if i is not None)


class LLM:
    """``LLM(model, **EngineConfig fields).generate(prompts, SamplingParams(...))``.

    ``draft=`` names a smaller model with the same tokenizer for speculative decoding, or "ngram"
    (prompt lookup, no model): it proposes ``num_speculative_tokens`` tokens per step and the target
    verifies them in one forward; outputs are distributed exactly as without it (greedy: identical).
    """

    def __init__(self, model: str | Path, draft: str | Path | None = None, **config):
        self.config = EngineConfig(**config)
        if self.config.draft_vocab is not None and (draft is None or str(draft) == NGRAM):
            raise UserError("draft_vocab (--draft-vocab) applies to a draft model: give draft=MODEL (--draft MODEL)")
        model_dir = resolve(str(model))
        if draft is not None and str(draft) != NGRAM:  # a bad draft fails before the target loads
            try:
                draft = resolve(str(draft))
                check_tokenizer(draft)
            except UserError as e:
                raise UserError(f"draft: {e}") from None
        cfg = ModelConfig.from_hf(read_config(model_dir))
        gguf = (read_manifest(model_dir) or {}).get("gguf")  # a GGUF read keeping its codes: computed as llama.cpp does
        self.config = self.config.resolved(checkpoint_dtype(model_dir), cfg.vocab_size * cfg.hidden_size, cfg.tie_word_embeddings, gguf)
        self.tokenizer = load_tokenizer(model_dir)
        # read as stored and made int8 row by row (never widened whole), where the int8 kernel builds
        int8_head = ("lm_head",) if self.config.cpu_lm_head == "int8" and int8_rows_cpu.load() is not None else ()
        decoder = load_model(model_dir, self.config.torch_dtype, self.config.device, int8_head)
        self.vocab_size, context = decoder.cfg.vocab_size, decoder.cfg.max_position_embeddings
        self.max_model_len = min(self.config.max_model_len or context, context)
        self.eos_token_ids = eos_ids(decoder.cfg.eos_token_id, self.tokenizer)
        self.runner = ModelRunner(decoder, self.config, self.max_model_len)
        self.blocks = BlockManager(self.runner.num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.config, self.blocks, self.max_model_len)
        self.sampler = Sampler()
        self.drafter = self._drafter(draft)
        self.spec_stats = SpecStats(self.config.num_speculative_tokens)
        self.detokenizer = Detokenizer(self.tokenizer)
        self.requests: dict[int, Sequence] = {}  # unfinished, by request id
        self._ids = count()

    def _drafter(self, draft: str | Path | None) -> Drafter | NgramDrafter | None:
        if draft is None:
            return None
        if str(draft) == NGRAM:
            return NgramDrafter(self.config.num_speculative_tokens, self.max_model_len, self.vocab_size, self.config.device)
        return Drafter(draft, self.tokenizer, self.vocab_size, self.config, self.runner.num_blocks, self.max_model_len)

    def add_request(self, prompt: Prompt, params: SamplingParams | None = None) -> int:
        """Queue one request; a bad one raises UserError and leaves the engine as it was."""
        seq = self.make_sequence(prompt, params or SamplingParams())
        self.enqueue(seq)
        return seq.id

    def abort(self, request_id: int) -> None:
        """Stop a request and free its blocks; unknown or finished ids are ignored."""
        seq = self.requests.pop(request_id, None)
        if seq is not None:
            self.scheduler.finish(seq, "abort")
            if self.drafter:
                self.drafter.sync()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[RequestOutput]:
        """Run one scheduled step; an output for every request that gained tokens."""
        if self.drafter:
            self.drafter.propose(self.scheduler.running)
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        logits, prompt_logits = self.runner.run(batch)  # [sum of sample rows, V], [R, V]
        sampling = [s for i, s in enumerate(batch.seqs) if batch.samples(i)]
        rows = logits.split([1 + s.num_draft for s in sampling])
        new_tokens = self._new_tokens(rows, sampling)
        kept_from = [s.num_tokens - s.num_draft for s in sampling]
        self._record_prompt_logprobs(batch, prompt_logits)
        self.scheduler.postprocess(batch, new_tokens)
        self._record_logprobs(rows, sampling, kept_from)
        for seq in sampling:
            if seq.params.stop and not seq.finished and self.detokenizer.hits_stop(seq):
                self.scheduler.finish(seq, "stop")
        if self.drafter:
            self.drafter.sync()
        return [self._output(seq, seq.token_ids[start:]) for seq, start in zip(sampling, kept_from)]

    def _new_tokens(self, rows: tuple[torch.Tensor, ...], sampling: list[Sequence]) -> list[list[int]]:
        """Per sampling sequence: its accepted draft tokens, then one token from the target."""
        if not any(s.num_draft for s in sampling):
            return [[t] for t in self.sampler(torch.cat(rows), sampling)] if sampling else []
        out = []
        for seq, seq_logits in zip(sampling, rows):  # seq_logits [1 + num_draft, V]
            drafts = seq.token_ids[seq.num_tokens - seq.num_draft:]
            if seq.params.greedy:
                tokens = accept_greedy(seq_logits.argmax(-1).tolist(), drafts)
            else:
                tokens = accept(warp(seq_logits, [seq] * len(seq_logits)), self.drafter.draft_probs(seq), drafts, seq.generator)
            self.spec_stats.record(len(drafts), len(tokens) - 1)
            out.append(tokens)
        return out

    @staticmethod
    def _record_logprobs(rows: tuple[torch.Tensor, ...], sampling: list[Sequence], kept_from: list[int]) -> None:
        """Logprobs of the tokens each sequence kept this step, from the rows that scored them."""
        for seq, seq_logits, start in zip(sampling, rows, kept_from):
            if seq.params.logprobs is not None:
                kept = seq.token_ids[start:]
                seq.logprobs += token_logprobs(seq_logits[:len(kept)], kept, seq.params.logprobs, seq.params.logprob_token_ids)

    @staticmethod
    def _record_prompt_logprobs(batch, prompt_logits: torch.Tensor) -> None:
        row = 0
        for i, first, n in batch.prompt_logprob_rows():  # before postprocess moves num_computed on
            seq = batch.seqs[i]
            targets = seq.token_ids[first + 1:first + 1 + n]
            seq.prompt_logprobs[first + 1:first + 1 + n] = token_logprobs(prompt_logits[row:row + n], targets, seq.params.prompt_logprobs)
            row += n

    def generate(self, prompts: Prompt | list[Prompt], params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
        """Run prompts to completion (together with whatever else is queued); outputs in prompt order."""
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise UserError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        seqs = [self.make_sequence(p, sp) for p, sp in zip(prompts, params)]  # validate all before queuing any
        for seq in seqs:
            self.enqueue(seq)
        done: dict[int, RequestOutput] = {}
        while not all(seq.finished for seq in seqs):
            done.update((out.request_id, out) for out in self.step() if out.finished)
        return [done[seq.id] for seq in seqs]

    def stream(self, prompt: Prompt, params: SamplingParams | None = None) -> Iterator[str]:
        """Text of one request as it is generated (other queued requests are served alongside)."""
        seq = self.make_sequence(prompt, params or SamplingParams())
        self.enqueue(seq)
        sent = 0
        while not seq.finished:
            self.step()
            text = self.detokenizer.text(seq)
            if len(text) > sent:
                yield text[sent:]
                sent = len(text)

    def make_sequence(self, prompt: Prompt, params: SamplingParams) -> Sequence:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise UserError("the prompt is empty")
        if not all(0 <= t < self.vocab_size for t in ids):
            raise UserError(f"prompt token ids must be in [0, {self.vocab_size})")
        if not all(0 <= t < self.vocab_size for t in params.logprob_token_ids):
            raise UserError(f"logprob_token_ids must be in [0, {self.vocab_size})")
        if len(ids) >= self.max_model_len:
            raise UserError(f"the prompt has {len(ids)} tokens; the model's context is {self.max_model_len} "
                            f"and at least one token must be left to generate")
        need = self.blocks.blocks_needed(min(len(ids) + params.max_tokens, self.max_model_len))
        if need > self.blocks.num_blocks:
            raise UserError(f"the request needs {need} KV blocks and the pool has {self.blocks.num_blocks}; "
                            f"shorten it or give the engine more kv_cache_memory")
        return Sequence(next(self._ids), ids, params, self.eos_token_ids)

    def enqueue(self, seq: Sequence) -> None:
        self.requests[seq.id] = seq
        self.scheduler.add(seq)

    def _output(self, seq: Sequence, new_token_ids: list[int]) -> RequestOutput:
        if not seq.finished:
            return RequestOutput(seq.id, new_token_ids, seq.output_token_ids)
        self.requests.pop(seq.id, None)
        return RequestOutput(seq.id, new_token_ids, seq.output_token_ids, self.detokenizer.text(seq), True, seq.finish_reason)
