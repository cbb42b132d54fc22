"""llama.cpp's side of the GGUF comparison, through llama-cpp-python (the `llamacpp` extra): its own quantizer,
perplexity from its logits, and its greedy continuation, each on a GGUF file.

Perplexity follows compress.eval.perplexity's protocol exactly: the same token ids (WikiText-2 tokenized once
by the model's tokenizer, no BOS), the same non-overlapping windows, every window evaluated from an empty KV
cache, exp of the mean NLL over seq_len - 1 predicted tokens per window.
"""

import ctypes
import math
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from compress.bench.llamacpp import import_llama_cpp
from compress.errors import UserError
from compress.eval.perplexity import window_nll
from compress.gguf.types import FILE_TYPES


def quantize(src: Path, out: Path, gguf_type: str, threads: int) -> float:
    """llama.cpp's quantizer (``llama-quantize SRC OUT TYPE``, no importance matrix) from an F32/F16 GGUF; returns the
    wall seconds. Written beside OUT and renamed into place."""
    llama_cpp = import_llama_cpp()
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FILE_TYPES[gguf_type].ftype
    params.nthread = threads
    tmp = out.with_name(f".{out.name}.partial")
    start = time.perf_counter()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
    seconds = time.perf_counter() - start
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise UserError(f"llama.cpp could not quantize {src} into {gguf_type} (return code {rc})")
    tmp.replace(out)
    return seconds


def load(path: Path, n_ctx: int, threads: int, logits_all: bool = False):
    llama_cpp = import_llama_cpp()
    return llama_cpp.Llama(str(path), n_ctx=n_ctx, n_batch=n_ctx, logits_all=logits_all, n_threads=threads,
                           n_threads_batch=threads, verbose=False)


def perplexity(path: Path, wins: torch.Tensor, threads: int) -> float:
    """exp(mean NLL) of llama.cpp's logits on ``wins`` [W, T] (ids of our tokenizer, which llama.cpp's vocabulary in a
    file we or llama.cpp wrote shares token for token)."""
    llm = load(path, wins.shape[1], threads, logits_all=True)
    nll = 0.0
    for win in tqdm(wins, desc=f"llama.cpp {path.name}", unit="window"):
        llm.reset()
        llm.eval(win.tolist())
        logits = torch.from_numpy(np.array(llm.scores[: win.numel()], dtype=np.float32))  # [T, V]
        nll += window_nll(logits[None], win[None])
    return math.exp(nll / (wins.shape[0] * (wins.shape[1] - 1)))


def greedy(path: Path, prompts: list[list[int]], max_tokens: int, threads: int) -> list[list[int]]:
    """llama.cpp's greedy continuation ids of each prompt (ids), ``max_tokens`` each, EOS not special."""
    llm = load(path, max(len(p) for p in prompts) + max_tokens + 8, threads)
    outs = []
    for prompt in prompts:
        llm.reset()
        ids = []
        for token in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):
            ids.append(token)
            if len(ids) == max_tokens:
                break
        outs.append(ids)
    return outs
