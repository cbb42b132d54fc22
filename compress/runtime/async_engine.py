"""AsyncEngine: the LLM stepped on its own thread, fed and drained by asyncio request handlers.

The engine's state is touched by the engine thread only. Handlers validate a request into a
Sequence on their own thread, then post it (or an abort) to a command queue the engine thread
drains before every step; updates come back through each request's asyncio.Queue, posted with
call_soon_threadsafe. An idle engine thread sleeps on an Event until a command arrives.
"""

import asyncio
import queue
import sys
import threading
import time
import traceback
from dataclasses import dataclass

from compress.errors import UserError
from compress.runtime.engine import LLM, Prompt
from compress.runtime.logprobs import TokenLogprob
from compress.runtime.metrics import Metrics
from compress.runtime.sequence import SamplingParams, Sequence


class QueueFull(Exception):
    """The waiting queue holds max_waiting requests already."""


@dataclass
class Update:
    """What one request's consumer receives after a step that advanced it."""

    tag: int  # the consumer's own label (the choice index of a multi-prompt request)
    text: str  # output text so far (streaming requests and finished ones; see Detokenizer.text)
    new_token_ids: list[int]
    logprobs: list[TokenLogprob]  # for new_token_ids, when asked for
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None  # the engine failed this request


@dataclass
class _Stream:
    seq: Sequence
    loop: asyncio.AbstractEventLoop
    sink: asyncio.Queue
    tag: int
    wants_text: bool
    arrival: float
    last_token: float | None = None
    sent_logprobs: int = 0

    def post(self, update: Update) -> None:
        self.loop.call_soon_threadsafe(self.sink.put_nowait, update)


class AsyncEngine:
    def __init__(self, llm: LLM, max_waiting: int = 256):
        if max_waiting <= 0:
            raise UserError(f"max_waiting must be positive, got {max_waiting}")
        self.llm, self.max_waiting = llm, max_waiting
        self.metrics = Metrics()
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._posted = 0  # requests posted but not yet taken by the engine thread
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[int, _Stream] = {}  # engine thread only
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="compress-engine", daemon=True)
        self._thread.start()

    def submit(self, prompts: list[Prompt], params: SamplingParams, sink: asyncio.Queue, stream: bool) -> list[Sequence]:
        """Validate and queue one request per prompt (all or none); updates go to sink tagged by prompt index.
        Raises UserError for a bad request and QueueFull when the waiting queue has no room for them all."""
        seqs = [self.llm.make_sequence(p, params) for p in prompts]
        with self._lock:
            if self.num_waiting + len(seqs) > self.max_waiting:
                raise QueueFull(f"the server has {self.num_waiting} requests waiting (limit {self.max_waiting}); retry later")
            self._posted += len(seqs)
        loop, now = asyncio.get_running_loop(), time.monotonic()
        for tag, seq in enumerate(seqs):
            self._commands.put(_Stream(seq, loop, sink, tag, stream, now))
        self._wake.set()
        return seqs

    def abort(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._commands.put(seq.id)
        self._wake.set()

    @property
    def num_waiting(self) -> int:
        return self._posted + len(self.llm.scheduler.waiting)

    def shutdown(self) -> None:
        self._running = False
        self._wake.set()
        self._thread.join()

    def render_metrics(self) -> str:
        llm, blocks = self.llm, self.llm.blocks
        lookups = blocks.num_prefix_hits + blocks.num_allocated
        gauges = {
            "compress_num_requests_running": ("Requests in the running batch.", len(llm.scheduler.running)),
            "compress_num_requests_waiting": ("Requests waiting to be scheduled.", self.num_waiting),
            "compress_kv_blocks_used": ("KV cache blocks held by requests.", blocks.num_blocks - blocks.num_free),
            "compress_kv_blocks_total": ("KV cache blocks in the pool.", blocks.num_blocks),
            "compress_prefix_cache_hit_rate": ("Share of needed KV blocks found in the prefix cache.",
                                               blocks.num_prefix_hits / lookups if lookups else 0.0),
        }
        counters = {"compress_num_preemptions_total": ("Sequences preempted for lack of KV blocks.", llm.scheduler.num_preemptions)}
        if llm.drafter:
            spec = llm.spec_stats
            counters |= {
                "compress_spec_decode_draft_tokens_total": ("Draft tokens proposed for verification.", sum(spec.proposed)),
                "compress_spec_decode_accepted_tokens_total": ("Draft tokens the target accepted.", sum(spec.accepted)),
                "compress_spec_decode_steps_total": ("Verification steps with at least one draft token.", spec.steps),
            }
        return self.metrics.render(gauges, counters)

    def _loop(self) -> None:
        while self._running:
            self._wake.clear()
            self._drain()
            if not self.llm.has_unfinished():
                self._wake.wait()
                continue
            try:
                outputs = self.llm.step()
            except Exception as exc:  # a bug must not take the server down: fail what was running, keep serving
                traceback.print_exc(file=sys.stderr)
                self._fail_all(f"internal error: {exc}")
                continue
            now = time.monotonic()
            for out in outputs:
                self._deliver(self._streams[out.request_id], out.new_token_ids, now)

    def _drain(self) -> None:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return
            if isinstance(command, _Stream):
                with self._lock:
                    self._posted -= 1
                self._streams[command.seq.id] = command
                self.llm.enqueue(command.seq)
                self.metrics.prompt_tokens += command.seq.num_prompt_tokens
            elif command in self._streams:  # an abort of a request still known
                self.llm.abort(command)
                del self._streams[command]
                self.metrics.finished["abort"] += 1

    def _deliver(self, stream: _Stream, new_token_ids: list[int], now: float) -> None:
        seq, metrics = stream.seq, self.metrics
        metrics.generation_tokens += len(new_token_ids)
        if stream.last_token is None:
            metrics.ttft.observe(now - stream.arrival)
        else:
            metrics.itl.observe(now - stream.last_token)
        stream.last_token = now
        logprobs = seq.logprobs[stream.sent_logprobs:]
        stream.sent_logprobs = len(seq.logprobs)
        text = self.llm.detokenizer.text(seq) if stream.wants_text or seq.finished else ""
        stream.post(Update(stream.tag, text, list(new_token_ids), logprobs, seq.finished, seq.finish_reason))
        if seq.finished:
            metrics.e2e.observe(now - stream.arrival)
            metrics.finished[seq.finish_reason] += 1
            del self._streams[seq.id]

    def _fail_all(self, message: str) -> None:
        for request_id, stream in list(self._streams.items()):
            self.llm.abort(request_id)
            stream.post(Update(stream.tag, "", [], [], True, "abort", message))
        self._streams.clear()
