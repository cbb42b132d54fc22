"""RequestOutput: what the engine reports about one request after a step."""

from dataclasses import dataclass, field


@dataclass
class RequestOutput:
    request_id: int
    new_token_ids: list[int]  # sampled in this step (empty for a prefill chunk, an abort)
    token_ids: list[int] = field(default_factory=list)  # all output tokens so far
    text: str = ""  # the output text; complete once finished
    finished: bool = False
    finish_reason: str | None = None  # "stop", "length" or "abort"
