"""EngineConfig: the knobs of the runtime, validated once when the engine is built."""

from dataclasses import dataclass, replace

import psutil
import torch

from compress.errors import UserError
from compress.model.load import dtype_name

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
AUTO = "auto"  # the checkpoint's dtype on CUDA; float32 on CPU, where the C kernels are fp32
LM_HEADS = (AUTO, "stored", "int8")  # CPU: the lm_head as the checkpoint stores it, or int8 per row (docs/runtime.md)
# "auto": int8 for an untied lm_head whose fp32 copy would take more than this share of the available memory
# (Qwen3's and Gemma's large vocabularies on a laptop), else as stored. A tied one is the embedding's table: kept.
LM_HEAD_SHARE = 0.1
# A GGUF read keeping its codes (compress.json "gguf"): llama.cpp computes its quantized types on 8-bit activations
# and reads a quantized output layer, so "auto" does the same there (int8 activations, int8 lm_head rows; an output
# layer read keeping its codes runs those instead, cpu_linears).
UNQUANTIZED_GGUF = ("F32", "F16", "BF16")


@dataclass
class EngineConfig:
    max_num_seqs: int = 64  # sequences running at once (and scheduled per step)
    max_num_batched_tokens: int = 512  # token budget of one step; longer prompts are prefilled in chunks
    block_size: int = 16  # tokens per KV block
    kv_cache_memory: int | None = None  # bytes for the KV pool; None: kv_cache_fraction of free memory
    kv_cache_fraction: float = 0.1
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True
    dtype: str = AUTO
    device: str = "cuda" if torch.cuda.is_available() else "cpu"
    num_speculative_tokens: int = 4  # draft tokens per step when the engine has a draft model
    draft_vocab: int | None = None  # the draft proposes only token ids below this (None: all)
    cpu_lm_head: str = AUTO  # CPU: "int8" holds the lm_head as int8 per row (a quarter of fp32's bytes); see LM_HEAD_SHARE
    cpu_int8_activations: bool | None = None  # CPU: int4 Linears round their inputs to int8 (integer dot products);
    # None: only for a GGUF read keeping its codes

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "num_speculative_tokens"):
            if getattr(self, name) <= 0:
                raise UserError(f"{name} must be positive, got {getattr(self, name)}")
        if self.draft_vocab is not None and self.draft_vocab <= 0:
            raise UserError(f"draft_vocab must be positive, got {self.draft_vocab}")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise UserError(f"kv_cache_memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if not 0 < self.kv_cache_fraction <= 1:
            raise UserError(f"kv_cache_fraction must be in (0, 1], got {self.kv_cache_fraction}")
        if self.max_model_len is not None and self.max_model_len <= 1:
            raise UserError(f"max_model_len must be at least 2, got {self.max_model_len}")
        if self.dtype not in (AUTO, *DTYPES):
            raise UserError(f"dtype must be one of {AUTO}, {', '.join(DTYPES)}, got {self.dtype}")
        if self.cpu_lm_head not in LM_HEADS:
            raise UserError(f"cpu_lm_head must be one of {', '.join(LM_HEADS)}, got {self.cpu_lm_head}")
        if not self.device.startswith("cpu") and (self.cpu_lm_head == "int8" or self.cpu_int8_activations):
            raise UserError("--cpu-lm-head and --cpu-int8-activations apply to the CPU runtime; leave them out on a GPU")
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise UserError(f"device {self.device} requested but CUDA is not available")

    def resolved(self, stored: torch.dtype, lm_head_numel: int = 0, tied: bool = True, gguf: dict | None = None) -> "EngineConfig":
        """This config with dtype, cpu_lm_head "auto" and cpu_int8_activations None made concrete for a checkpoint stored
        as ``stored`` whose lm_head has ``lm_head_numel`` weights (``tied``: it is the embedding's table); ``gguf``: its
        compress.json "gguf" entry where it is a GGUF read keeping its codes (reader.convert)."""
        out, cpu = self, self.device.startswith("cpu")
        if self.dtype == AUTO:
            name = dtype_name(stored)
            out = replace(out, dtype=name if self.device.startswith("cuda") and name in DTYPES else "float32")
        if self.cpu_lm_head == AUTO:
            big = not tied and cpu and lm_head_numel * 4 > LM_HEAD_SHARE * psutil.virtual_memory().available
            quantized_head = cpu and gguf is not None and gguf.get("output") not in UNQUANTIZED_GGUF
            out = replace(out, cpu_lm_head="int8" if big or quantized_head else "stored")
        if self.cpu_int8_activations is None:
            out = replace(out, cpu_int8_activations=cpu and gguf is not None)
        return out

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == AUTO:
            raise ValueError("EngineConfig.dtype is 'auto'; call resolved() with the checkpoint's dtype first")
        return DTYPES[self.dtype]
