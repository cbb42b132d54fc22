"""The decoding runtime: continuous batching over a paged KV cache (docs/runtime.md)."""

from compress.runtime.config import EngineConfig
from compress.runtime.engine import LLM
from compress.runtime.output import RequestOutput
from compress.runtime.sequence import SamplingParams

__all__ = ["LLM", "EngineConfig", "RequestOutput", "SamplingParams"]
