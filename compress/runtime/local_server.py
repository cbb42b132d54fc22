"""A server on a free loopback port, on a thread of this process: for tests and the load test."""

import socket
import threading
import time
from contextlib import contextmanager

import uvicorn

from compress.runtime.async_engine import AsyncEngine
from compress.runtime.engine import LLM
from compress.runtime.server import Server, build_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(llm: LLM, name: str = "tiny", api_key: str | None = None, max_waiting: int = 256,
                   max_body_bytes: int = 4 << 20):
    """Yields (base url, AsyncEngine) while the server runs on its own thread."""
    engine = AsyncEngine(llm, max_waiting)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(Server(engine, name, api_key, max_body_bytes)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}", engine
    finally:
        server.should_exit = True
        thread.join()
        engine.shutdown()
