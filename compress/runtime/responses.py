"""OpenAI response bodies (completions, chat, their stream chunks, errors) from engine updates."""

import json
import time
import uuid
from dataclasses import dataclass, field

from compress.runtime.logprobs import TokenLogprob


def error_body(message: str, type_: str, code: str | None = None, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def sse(body: dict | str) -> str:
    return f"data: {body if isinstance(body, str) else json.dumps(body)}\n\n"


@dataclass
class Choice:
    """One prompt's output as it accumulates: the engine's text so far, its tokens and logprobs."""

    text: str = ""
    sent: int = 0  # characters of text already streamed
    chunks: int = 0  # stream chunks sent
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None

    def update(self, update) -> str:
        """Fold in an engine Update; returns the text not streamed before."""
        self.token_ids += update.new_token_ids
        self.logprobs += update.logprobs
        self.text = update.text or self.text
        if update.finished:
            self.finish_reason, self.error = update.finish_reason, update.error
        delta, self.sent = self.text[self.sent:], max(self.sent, len(self.text))
        return delta


class Responder:
    """Builds the JSON of one request's responses; knows the model name, the tokenizer, the request id."""

    def __init__(self, tokenizer, model: str, prefix: str):
        self.tokenizer, self.model = tokenizer, model
        self.id, self.created = f"{prefix}-{uuid.uuid4().hex}", int(time.time())

    def envelope(self, obj: str, choices: list[dict], usage: dict | None = None) -> dict:
        body = {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return body

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def completion_logprobs(self, entries: list[TokenLogprob | None], offset: int = 0) -> dict:
        """The legacy completions form; a prompt's first token has no logprob (None).
        top_logprobs holds the chosen token too, as vLLM's does (lm-eval's greedy check relies on it)."""
        tokens, token_lps, tops, offsets = [], [], [], []
        for entry in entries:
            text = self.token(entry.token_id) if entry else ""
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            token_lps.append(entry.logprob if entry else None)
            tops.append({**{self.token(t): lp for t, lp in entry.top}, text: entry.logprob} if entry else None)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def chat_logprobs(self, entries: list[TokenLogprob]) -> dict:
        def item(token_id: int, logprob: float) -> dict:
            text = self.token(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

        return {"content": [{**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
                            for e in entries]}
