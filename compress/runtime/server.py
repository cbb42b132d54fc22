"""OpenAI-compatible HTTP server over the engine: /v1/completions, /v1/chat/completions, /v1/models,
/health, /metrics. The engine runs on its own thread (AsyncEngine); handlers only translate."""

import asyncio
import copy
import hmac
import json
import socket
import sys

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException

from compress.errors import UserError
from compress.runtime.async_engine import AsyncEngine, QueueFull
from compress.runtime.protocol import ChatCompletionRequest, CompletionRequest
from compress.runtime.responses import Choice, Responder, error_body, sse

DISCONNECT_POLL_S = 0.5


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.body = status, error_body(message, type_, code, param)


class Server:
    def __init__(self, engine: AsyncEngine, served_name: str, api_key: str | None = None, max_body_bytes: int = 4 << 20):
        self.engine, self.served_name, self.api_key, self.max_body_bytes = engine, served_name, api_key, max_body_bytes
        # The engine thread detokenizes with the engine's tokenizer; a fast tokenizer must not be used
        # from two threads at once ("Already borrowed"), so handlers tokenize with their own copy.
        self.tokenizer = copy.deepcopy(engine.llm.tokenizer)

    # --- request intake -------------------------------------------------------------------------
    def authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           "authentication_error", "invalid_api_key")

    async def body(self, request: Request, model_cls):
        self.authorize(request)
        declared = request.headers.get("content-length", "")
        size, chunks = int(declared) if declared.isdigit() else 0, []
        if size <= self.max_body_bytes:
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.max_body_bytes:
                    break
                chunks.append(chunk)
        if size > self.max_body_bytes:
            raise ApiError(413, f"the request body is over {self.max_body_bytes} bytes", code="request_too_large")
        try:
            req = model_cls.model_validate(json.loads(b"".join(chunks)))
        except ValueError as exc:  # json.JSONDecodeError and pydantic's ValidationError are both ValueErrors
            raise self._bad_body(exc) from None
        if req.model is not None and req.model != self.served_name:
            raise ApiError(404, f"the model '{req.model}' does not exist; this server serves '{self.served_name}'",
                           code="model_not_found", param="model")
        return req

    @staticmethod
    def _bad_body(exc: ValueError) -> ApiError:
        if not isinstance(exc, ValidationError):
            return ApiError(400, f"the body is not valid JSON: {exc}")
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"])
        return ApiError(400, f"{param}: {err['msg']}" if param else err["msg"], param=param or None)

    def submit(self, prompts, params, stream: bool):
        sink: asyncio.Queue = asyncio.Queue()
        try:
            return self.engine.submit(prompts, params, sink, stream), sink
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        except QueueFull as exc:
            raise ApiError(429, str(exc), "rate_limit_error", "queue_full") from None

    # --- running requests ---------------------------------------------------------------------
    async def collect(self, request: Request, seqs, sink: asyncio.Queue) -> list[Choice]:
        """Wait for every choice to finish; a client that goes away aborts the request."""
        choices = [Choice() for _ in seqs]
        try:
            while any(c.finish_reason is None for c in choices):
                try:
                    update = await asyncio.wait_for(sink.get(), DISCONNECT_POLL_S)
                except TimeoutError:
                    if await request.is_disconnected():
                        return choices
                    continue
                choices[update.tag].update(update)
        finally:
            if any(c.finish_reason is None for c in choices):
                self.engine.abort(seqs)
        failed = next((c.error for c in choices if c.error), None)
        if failed:
            raise ApiError(500, failed, "server_error")
        return choices

    async def stream(self, seqs, sink: asyncio.Queue, chunk, final: dict | None):
        """SSE: chunk(tag, delta, update, first) -> body for every update; then final (usage), then [DONE].
        Starlette cancels this generator when the client disconnects; the finally aborts the request."""
        choices = [Choice() for _ in seqs]
        try:
            while any(c.finish_reason is None for c in choices):
                update = await sink.get()
                choice = choices[update.tag]
                delta = choice.update(update)
                if update.error:
                    yield sse(error_body(update.error, "server_error"))
                    break
                if delta or update.finished or update.logprobs:
                    yield sse(chunk(update.tag, delta, update, choice.chunks == 0))
                    choice.chunks += 1
            else:
                if final is not None:
                    final["usage"]["completion_tokens"] = sum(len(c.token_ids) for c in choices)
                    final["usage"]["total_tokens"] += final["usage"]["completion_tokens"]
                    yield sse(final)
            yield sse("[DONE]")
        finally:
            if any(c.finish_reason is None for c in choices):
                self.engine.abort(seqs)

    # --- routes ------------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req = await self.body(request, CompletionRequest)
        try:
            params = req.params()
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        prompts = [self.tokenizer.encode(p) if isinstance(p, str) else p for p in req.prompt]
        seqs, sink = self.submit(prompts, params, req.stream)
        out = Responder(self.tokenizer, self.served_name, "cmpl")
        prompt_texts = [self.tokenizer.decode(s.token_ids[:s.num_prompt_tokens]) if req.echo else "" for s in seqs]
        prompt_tokens = sum(s.num_prompt_tokens for s in seqs)

        def logprobs(seq, entries, with_prompt: bool):
            if req.logprobs is None:
                return None
            return out.completion_logprobs((seq.prompt_logprobs if with_prompt else []) + entries)

        if req.stream:
            def chunk(tag, delta, update, first):
                text = (prompt_texts[tag] if first else "") + delta  # an echoed prompt goes first, once
                return out.envelope("text_completion", [{"index": tag, "text": text, "finish_reason": update.finish_reason,
                                                         "logprobs": logprobs(seqs[tag], update.logprobs, first and req.echo)}])
            final = out.envelope("text_completion", [], out.usage(prompt_tokens, 0)) if req.include_usage else None
            return StreamingResponse(self.stream(seqs, sink, chunk, final), media_type="text/event-stream")
        choices = await self.collect(request, seqs, sink)
        body = [{"index": i, "text": prompt_texts[i] + c.text, "finish_reason": c.finish_reason,
                 "logprobs": logprobs(seqs[i], c.logprobs, req.echo)} for i, c in enumerate(choices)]
        return JSONResponse(out.envelope("text_completion", body,
                                         out.usage(prompt_tokens, sum(len(c.token_ids) for c in choices))))

    async def chat(self, request: Request) -> Response:
        req = await self.body(request, ChatCompletionRequest)
        prompt = self.chat_prompt(req)
        try:
            params = req.params(max(self.engine.llm.max_model_len - len(prompt), 1))
        except UserError as exc:
            raise ApiError(400, str(exc)) from None
        seqs, sink = self.submit([prompt], params, req.stream)
        out = Responder(self.tokenizer, self.served_name, "chatcmpl")
        logprobs = (lambda entries: out.chat_logprobs(entries) if req.logprobs else None)
        if req.stream:
            def chunk(tag, delta, update, first):
                role = {"role": "assistant"} if first else {}
                content = {"content": delta} if delta or not update.finished else {}
                return out.envelope("chat.completion.chunk", [{"index": 0, "delta": {**role, **content},
                                                               "logprobs": logprobs(update.logprobs),
                                                               "finish_reason": update.finish_reason}])
            final = out.envelope("chat.completion.chunk", [], out.usage(len(prompt), 0)) if req.include_usage else None
            return StreamingResponse(self.stream(seqs, sink, chunk, final), media_type="text/event-stream")
        [choice] = await self.collect(request, seqs, sink)
        body = [{"index": 0, "message": {"role": "assistant", "content": choice.text},
                 "logprobs": logprobs(choice.logprobs), "finish_reason": choice.finish_reason}]
        return JSONResponse(out.envelope("chat.completion", body, out.usage(len(prompt), len(choice.token_ids))))

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if not self.tokenizer.chat_template:
            raise ApiError(400, "this model's tokenizer has no chat template; use /v1/completions")
        try:
            messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def models(self, request: Request) -> JSONResponse:
        self.authorize(request)
        card = {"id": self.served_name, "object": "model", "created": 0, "owned_by": "compress",
                "max_model_len": self.engine.llm.max_model_len}
        return JSONResponse({"object": "list", "data": [card]})


def build_app(server: Server) -> FastAPI:
    app = FastAPI(title="compress", docs_url=None, redoc_url=None, openapi_url=None)
    app.post("/v1/completions")(server.completions)
    app.post("/v1/chat/completions")(server.chat)
    app.get("/v1/models")(server.models)
    app.get("/health")(lambda: Response(status_code=200))
    app.get("/metrics")(lambda: PlainTextResponse(server.engine.render_metrics(), media_type="text/plain; version=0.0.4"))

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(exc.detail), "invalid_request_error"), status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        print(f"server: {type(exc).__name__}: {exc}", file=sys.stderr)
        return JSONResponse(error_body("internal server error", "server_error"), status_code=500)

    return app


def check_listen(host: str, port: int) -> None:
    """Fail in one line, before the model loads, unless this machine can listen on host:port now."""
    if not 0 <= port <= 65535:
        raise UserError(f"--port must be in 0..65535, got {port}")
    if not host.strip():
        raise UserError("--host is empty; give an address such as 127.0.0.1 (this machine) or 0.0.0.0 (the network)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise UserError(f"--host {host} is not an address or name this machine can listen on ({e.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as e:
            raise UserError(f"cannot listen on {host}:{port} ({e.strerror}); choose another --port or --host") from None


def check_options(host: str, port: int, served_model_name: str | None, api_key: str | None, max_waiting: int,
                  max_body_bytes: int) -> None:
    """The server's own options, checked before the model loads."""
    if served_model_name is not None and not served_model_name.strip():
        raise UserError("--served-model-name is empty; give a name or leave it out to use MODEL")
    if api_key is not None and not api_key.strip():
        raise UserError("--api-key is empty; give a key, or leave it (and COMPRESS_API_KEY) out to serve without one")
    if max_waiting < 1 or max_body_bytes < 1:
        raise UserError(f"--max-waiting and --max-body-bytes must be at least 1, got {max_waiting} and {max_body_bytes}")
    check_listen(host, port)


def serve(model: str, host: str, port: int, served_model_name: str | None, api_key: str | None, max_waiting: int,
          max_body_bytes: int, **engine_config) -> None:
    """Load MODEL into an engine and serve it until interrupted."""
    import uvicorn

    from compress.runtime.engine import LLM

    check_options(host, port, served_model_name, api_key, max_waiting, max_body_bytes)
    llm = LLM(model, **engine_config)
    engine = AsyncEngine(llm, max_waiting)
    name = served_model_name or model
    app = build_app(Server(engine, name, api_key, max_body_bytes))
    auth = "API key required" if api_key else "no API key"
    print(f"serving {name} on http://{host}:{port}/v1 ({auth}; max {llm.config.max_num_seqs} running, "
          f"{max_waiting} waiting)", file=sys.stderr)
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        engine.shutdown()
