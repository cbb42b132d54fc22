"""A request's state as it moves through the engine, and the SamplingParams it was sent with."""

import enum
from dataclasses import dataclass

import torch

from compress.errors import UserError
from compress.runtime.logprobs import MAX_LOGPROBS, TokenLogprob


@dataclass
class SamplingParams:
    """How one request is decoded. temperature 0 is greedy; top_k 0 and top_p 1 switch those filters off."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # top alternatives reported per output token (None: no logprobs)
    # with logprobs: also the logprobs of these ids at every output position (one request scores
    # every one-token answer of a multiple-choice question)
    logprob_token_ids: tuple[int, ...] = ()
    prompt_logprobs: int | None = None  # the same for the prompt tokens from position score_from on
    score_from: int = 1  # the prefix cache may serve the prompt up to position score_from - 2

    def __post_init__(self):
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        self.stop_token_ids = tuple(self.stop_token_ids)
        self.logprob_token_ids = tuple(self.logprob_token_ids)
        if self.max_tokens <= 0:
            raise UserError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature < 0:
            raise UserError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {self.top_p}")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and not 0 <= k <= MAX_LOGPROBS:
                raise UserError(f"{name} must be in [0, {MAX_LOGPROBS}], got {k}")
        if self.logprob_token_ids and self.logprobs is None:
            raise UserError("logprob_token_ids needs logprobs (the number of top alternatives, 0 for none)")
        if self.score_from < 1:
            raise UserError(f"score_from must be >= 1 (the first token has no logprob), got {self.score_from}")
        if any(not s for s in self.stop):
            raise UserError("stop strings must not be empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    """Tokens (prompt + output), how many of them have KV in the cache, and the blocks that hold it.

    After a preemption ``num_computed`` drops to 0 and the whole of ``token_ids`` (prompt and
    output so far) is prefilled again; sampling resumes where it stopped.
    """

    def __init__(self, seq_id: int, prompt_token_ids: list[int], params: SamplingParams, eos_token_ids: frozenset[int]):
        self.id = seq_id
        self.token_ids = list(prompt_token_ids)
        self.num_prompt_tokens = len(prompt_token_ids)
        self.params = params
        self.stop_ids = frozenset(params.stop_token_ids) | (frozenset() if params.ignore_eos else eos_token_ids)
        self.status = Status.WAITING
        self.num_computed = 0  # tokens whose K/V are in the cache
        self.num_draft = 0  # trailing token_ids proposed by a draft model, not yet verified (speculative decoding)
        self.block_table: list[int] = []  # physical block ids, in token order
        self.block_hashes: list[int] = []  # chained hashes of the leading full blocks, once computed
        self.finish_reason: str | None = None
        self.logprobs: list[TokenLogprob] = []  # one per output token, when params.logprobs is set
        self.prompt_logprobs: list[TokenLogprob | None] = [None] * len(prompt_token_ids)  # when prompt_logprobs is set
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def keep_draft(self, n: int) -> None:
        """Drop all but the first n draft tokens."""
        if n < self.num_draft:
            del self.token_ids[self.num_tokens - self.num_draft + n:]
            self.num_draft = n

    @property
    def max_cached_tokens(self) -> int:
        """Leading tokens the prefix cache may serve: all but those whose logits score a prompt token."""
        return self.num_tokens if self.params.prompt_logprobs is None else self.params.score_from - 1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
