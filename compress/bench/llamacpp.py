"""`compress bench MODEL --llamacpp GGUF`: batch-1 decode of llama.cpp beside our engine, in one process.

llama.cpp (llama-cpp-python, the `llamacpp` extra) decodes GGUF at batch 1 and our engine MODEL (an
int4 export of the same model) at each batch size, both from the same prompt token ids, greedy, with
the same number of threads. The runs are interleaved (llama.cpp, then ours at every batch size, then
again), so a slow patch of a shared machine costs both sides, and each side keeps its fastest of
`repeats` runs. Decode tok/s is `sweep.decode_tok_s` for both: tokens after the first one, per second
until the last, so prefill is left out. Every ratio is over llama.cpp's batch-1 tok/s, the number a
llama.cpp user gets from one stream.
"""

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from compress.bench.scale_bench import cpu_info
from compress.bench.sweep import SweepConfig, batch_workload, decode_tok_s, measure_batch, warm_up
from compress.errors import UserError
from compress.kernels import cpu_build, nibble_q8_cpu
from compress.runtime.engine import LLM

# Issue 26's targets, as ratios to llama.cpp's batch-1 decode tok/s.
TARGETS = {1: 1.0, 8: 2.0}
INSTALL = ("pip install 'compress[llamacpp]' (built from source: see docs/results/speed.md, "
           "'Against llama.cpp', for its CMAKE_ARGS)")

Decode = Callable[[list[int]], float]  # prompt token ids -> decode tok/s after that prompt


@dataclass(frozen=True)
class Comparison:
    theirs: float  # llama.cpp batch-1 decode tok/s, the best run
    ours: dict[int, float]  # batch size -> our decode tok/s, the best run


def check_gguf(gguf: Path) -> None:
    if not gguf.is_file() or gguf.suffix != ".gguf":
        raise UserError(f"--llamacpp {gguf}: not a .gguf file")


def import_llama_cpp():
    """The llama_cpp module, or one line saying how to install it (it is never a dependency of the package)."""
    try:
        import llama_cpp
    except ImportError:
        raise UserError(f"--llamacpp needs llama-cpp-python, which is not installed: {INSTALL}") from None
    return llama_cpp


def llamacpp_decoder(gguf: Path, cfg: SweepConfig, threads: int, vocab: int) -> tuple[Decode, str]:
    """A Decode function over a loaded llama.cpp model, and the version to print."""
    llama_cpp = import_llama_cpp()
    llm = llama_cpp.Llama(str(gguf), n_ctx=cfg.prompt_len + cfg.new_tokens + 16, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    if llm.n_vocab() != vocab:  # the same prompt ids must mean the same tokens on both sides
        raise UserError(f"--llamacpp {gguf}: its vocabulary has {llm.n_vocab()} tokens, MODEL's {vocab}; "
                        f"give a GGUF of the same model")

    def decode(prompt: list[int]) -> float:
        llm.reset()  # no prefix of the last run may be reused: prefill stays out of the timing, but so must a cache hit
        times = []
        for _ in llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0):  # greedy; generate never stops at EOS
            times.append(time.perf_counter())
            if len(times) == cfg.new_tokens:
                break
        return decode_tok_s([times])

    return decode, f"{llama_cpp.__version__}, built for {built_for(llama_cpp)}"


def built_for(llama_cpp) -> str:
    """The CPU features llama.cpp was compiled with (its system info's "X = 1" entries): an AVX2-only build on an
    AVX-512 host is the other x86 path, as COMPRESS_CPU_ISA=avx2 is ours."""
    info = llama_cpp.llama_print_system_info().decode()
    return " ".join(part.split("=")[0].split()[-1] for part in info.split("|") if part.strip().endswith("= 1")) or "?"


def compare(llm: LLM, theirs: Decode, cfg: SweepConfig) -> Comparison:
    """Both engines warmed up, then cfg.repeats rounds of llama.cpp at batch 1 and ours at every batch size."""
    warm_up(llm, cfg)
    theirs(batch_workload(1, cfg, llm.vocab_size, run=-1).prompts[0])  # llama.cpp's first call allocates too
    best_theirs, best_ours = 0.0, dict.fromkeys(cfg.batch_sizes, 0.0)
    for run in range(cfg.repeats):
        # our batch-1 run of this round gets the same prompt: batch_workload is seeded by (seed, batch, run)
        best_theirs = max(best_theirs, theirs(batch_workload(1, cfg, llm.vocab_size, run).prompts[0]))
        for b in cfg.batch_sizes:
            best_ours[b] = max(best_ours[b], measure_batch(llm, b, cfg, run).decode_tok_s)
    return Comparison(best_theirs, best_ours)


def target_cell(batch: int, ratio: float) -> str:
    if batch not in TARGETS:
        return "-"
    return f">= {TARGETS[batch]:.2f}x: {'met' if ratio >= TARGETS[batch] else 'not yet'}"


def row(*cells) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def table(c: Comparison, gguf: str, model: str) -> str:
    head = "| engine | model | batch | decode tok/s | / llama.cpp batch 1 | target |\n|---|---|---:|---:|---:|---|"
    rows = [row("llama.cpp", gguf, 1, f"{c.theirs:.1f}", "1.00x", "-")]
    rows += [row("compress", model, b, f"{tok_s:.1f}", f"{tok_s / c.theirs:.2f}x", target_cell(b, tok_s / c.theirs))
             for b, tok_s in c.ours.items()]
    return "\n".join([head, *rows])


def header(cfg: SweepConfig, threads: int, version: str) -> str:
    cpu, flags = cpu_info()
    return (f"llama.cpp (llama-cpp-python {version}) at batch 1 against compress: {cfg.prompt_len}-token prompts, "
            f"{cfg.new_tokens} new tokens (greedy), decode tok/s after the prompt, the fastest of {cfg.repeats} interleaved "
            f"runs each, {threads} threads\nhost: {cpu}; flags: {' '.join(flags) or 'none of the listed'}; "
            f"load average {os.getloadavg()[0]:.2f} at the start (other work on the host slows both engines, llama.cpp most)\n"
            f"our C kernels: COMPRESS_CPU_ISA={cpu_build.isa()}, int8 dot product {nibble_q8_cpu.isa()}")


def run_llamacpp(model_dir: Path, gguf: Path, cfg: SweepConfig, engine: dict, theirs: Decode | None = None) -> Comparison:
    """Print the comparison of MODEL (our engine, with the EngineConfig fields `engine`) with llama.cpp on GGUF.

    theirs replaces llama.cpp (the tests inject one); without it llama-cpp-python must be installed.
    """
    check_gguf(gguf)
    threads = torch.get_num_threads()  # our engine's threads; llama.cpp gets as many
    version = "(injected)"
    if theirs is None:
        import_llama_cpp()  # before our engine loads: a missing package is one line, at once
    llm = LLM(model_dir, **engine)
    if theirs is None:
        theirs, version = llamacpp_decoder(gguf, cfg, threads, llm.vocab_size)
    print(header(cfg, threads, version), flush=True)
    c = compare(llm, theirs, cfg)
    print(table(c, gguf.name, model_dir.name))
    return c
