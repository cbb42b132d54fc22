"""The OpenAI request bodies we accept, and their translation into SamplingParams.

Unknown fields are ignored (OpenAI clients send some we do not use, e.g. `user`); known fields
with a wrong type or value are a 400 naming the field.
"""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from compress.runtime.sequence import SamplingParams

MAX_OPENAI_LOGPROBS = 5


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)  # vLLM's extension; -1 or 0 = off
    seed: int | None = None
    stop: str | list[str] | None = Field(None, validate_default=True)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM's extension, for benchmarks

    @field_validator("n")
    @classmethod
    def _one_choice(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n=1 is supported")
        return n

    @field_validator("stop")
    @classmethod
    def _stops(cls, stop):
        stops = [stop] if isinstance(stop, str) else stop or []
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes up to 4 non-empty strings")
        return stops

    def sampling(self, max_tokens: int, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=max_tokens, temperature=self.temperature, top_k=max(self.top_k, 0),
                              top_p=self.top_p, seed=self.seed, stop=tuple(self.stop), ignore_eos=self.ignore_eos,
                              logprobs=logprobs, prompt_logprobs=prompt_logprobs)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int = Field(16, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_OPENAI_LOGPROBS)

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, prompt):
        if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
            prompt = [prompt]
        if not prompt or any(len(p) == 0 for p in prompt):
            raise ValueError("the prompt is empty")
        return prompt

    def params(self) -> SamplingParams:
        return self.sampling(self.max_tokens, self.logprobs, self.logprobs if self.echo and self.logprobs is not None else None)


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict] = ""

    def text(self) -> str:
        """The message as the chat template takes it: text parts joined (images are not supported)."""
        if isinstance(self.content, str):
            return self.content
        if any(part.get("type") != "text" for part in self.content):
            raise ValueError("only text content parts are supported")
        return "".join(part.get("text", "") for part in self.content)


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)

    def params(self, room: int) -> SamplingParams:
        """room: context left after the prompt, the default length as in vLLM."""
        max_tokens = self.max_completion_tokens or self.max_tokens or room
        return self.sampling(max_tokens, (self.top_logprobs or 0) if self.logprobs else None)
