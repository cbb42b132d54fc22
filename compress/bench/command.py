"""`compress bench MODEL`: the batch sweep beside its roofline, the mixed workload against transformers, --compare,
--llamacpp (batch-1 decode of llama.cpp on a GGUF against ours: compress/bench/llamacpp.py).

The roofline of a decode step at batch B: it reads the weights once and each sequence's KV cache
(context tokens), so tokens/s <= B x bandwidth / (weight bytes + B x KV bytes). "This machine"
uses the bandwidth of a copy test and the bytes the engine reads here; the GPU line uses the
datasheet bandwidth and FLOP/s of --gpu with the checkpoint's stored bytes (the CUDA path keeps
int4/int3 packed), so it is what the same checkpoint could reach there, not a measurement.
"""

import gc
from dataclasses import dataclass, field
from pathlib import Path

import torch

from compress.bench.bandwidth import copy_bandwidth
from compress.bench.footprint import Footprint, footprint, tensor_bytes
from compress.bench.mixed import check_mixed, run_mixed
from compress.bench.sweep import BatchResult, SweepConfig, parse_batch_sizes, sweep
from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.load import read_config
from compress.models import checkpoint_dtype, resolve
from compress.roofline import GPUS, decode_flops, kv_bytes_per_token, tokens_per_s_bound
from compress.runtime.config import EngineConfig
from compress.runtime.engine import LLM
from compress.runtime.ngram_drafter import NGRAM

WORKLOADS = ("batches", "mixed", "all")
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
MiB = 2**20
# What --batch-sizes and --repeats default to; --llamacpp's are the batch sizes of issue 26's targets (batch 1 and 8
# against llama.cpp's batch 1) and the fastest of 3 runs, as its comparison is made on a shared machine
SWEEP_DEFAULTS = dict(batch_sizes="1,8,32", repeats=1)
LLAMACPP_DEFAULTS = dict(batch_sizes="1,8", repeats=3)


@dataclass
class BenchConfig:
    workload: str = "batches"
    sweep: SweepConfig = field(default_factory=SweepConfig)
    gpu: str = "h100"
    compare: str | None = None  # a second MODEL, run in the same process
    plot: Path | None = None  # PNG of throughput vs batch size
    hf_baselines: bool = True  # mixed workload: transformers generate and continuous batching too
    requests: int = 64  # mixed workload
    max_prompt: int = 512
    max_new: int = 256
    kv_cache_memory: int | None = None  # None: batches sizes the pool to its largest batch; mixed takes the engine's default
    max_num_batched_tokens: int = 512
    copy_bytes: int = 512 * MiB
    drafts: tuple[str, ...] = ()  # instead of the workloads: speculative decoding with each draft vs the target alone
    num_speculative_tokens: int = 4
    draft_vocab: int | None = None  # the draft models' output layer keeps token ids below this
    temperature: float = 0.0  # speculative bench: 0 greedy (outputs must equal the target's), else seeded sampling
    llamacpp: Path | None = None  # instead of the workloads: batch-1 decode of llama.cpp on this GGUF against MODEL
    cpu_lm_head: str = "stored"  # EngineConfig's CPU options, for every engine of the run
    cpu_int8_activations: bool | None = None

    def __post_init__(self):
        if self.workload not in WORKLOADS:
            raise UserError(f"--workload must be one of {', '.join(WORKLOADS)}, got {self.workload}")
        if self.gpu not in GPUS:
            raise UserError(f"unknown --gpu '{self.gpu}': choose one of {', '.join(GPUS)}")
        if self.workload != "batches":
            check_mixed(self.requests, self.max_prompt, self.max_new)
        if self.plot is not None and self.workload == "mixed":
            raise UserError("--plot draws the batch sweep; use --workload batches or all")
        if self.plot is not None and not self.plot.parent.is_dir():
            raise UserError(f"--plot {self.plot}: the directory {self.plot.parent} does not exist")
        if self.plot is not None and self.plot.suffix.lower() not in PLOT_SUFFIXES:
            raise UserError(f"--plot {self.plot}: the file name must end in {', '.join(PLOT_SUFFIXES)}")
        if self.kv_cache_memory is not None and self.kv_cache_memory < 1:
            raise UserError(f"--kv-cache-memory must be a positive number of bytes, got {self.kv_cache_memory}")
        if self.temperature < 0:
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if not self.drafts and (self.temperature or self.draft_vocab is not None):
            raise UserError("--temperature and --draft-vocab apply to the speculative benchmark: give --draft")
        if self.llamacpp is not None and (self.compare or self.drafts or self.plot or self.workload != "batches"):
            raise UserError("--llamacpp compares one MODEL's batch decode with llama.cpp: leave out --compare, --draft, "
                            "--plot and --workload")
        if max(self.sweep.batch_sizes) > self.max_num_batched_tokens:
            raise UserError(f"batch size {max(self.sweep.batch_sizes)} does not fit one step's token budget "
                            f"(--max-num-batched-tokens {self.max_num_batched_tokens})")

    def engine(self, model_dir: Path) -> dict:
        """EngineConfig fields: room for the largest batch in one step and, for the sweep alone, a pool that just fits it."""
        kv = self.kv_cache_memory
        if kv is None and self.workload == "batches":
            itemsize = EngineConfig().resolved(checkpoint_dtype(model_dir)).torch_dtype.itemsize  # the dtype the engine runs here
            kv = self.sweep.kv_cache_bytes(kv_bytes_per_token(ModelConfig.from_hf(read_config(model_dir)), itemsize))
        return dict(kv_cache_memory=kv, max_num_batched_tokens=self.max_num_batched_tokens,
                    max_num_seqs=max(64, *self.sweep.batch_sizes), cpu_lm_head=self.cpu_lm_head,
                    cpu_int8_activations=self.cpu_int8_activations)


def run_benchmark(model: str, cfg: BenchConfig) -> list[list[dict]]:
    """Print the tables of cfg.workload for MODEL (and cfg.compare); returns the sweep's rows per model."""
    if cfg.llamacpp is not None:
        from compress.bench.llamacpp import run_llamacpp

        model_dir = resolve(model)
        check_context([model_dir], cfg)
        run_llamacpp(model_dir, cfg.llamacpp, cfg.sweep, cfg.engine(model_dir))
        return []
    if cfg.drafts:
        from compress.bench.speculative import run_spec_bench, table

        engine = cfg.engine(resolve(model)) | dict(draft_vocab=cfg.draft_vocab)
        check_context([resolve(model)], cfg)
        for draft in cfg.drafts:  # every draft is checked before any engine loads
            if draft != NGRAM:
                resolve(draft)
        print(table(run_spec_bench(model, list(cfg.drafts), cfg.num_speculative_tokens, cfg.sweep, engine, cfg.temperature)))
        return []
    names = [model] + ([cfg.compare] if cfg.compare is not None else [])
    models = list(zip(labels(names), [resolve(n) for n in names]))  # every MODEL is checked before any work
    check_context([d for _, d in models], cfg)
    rows = run_sweep(models, cfg) if cfg.workload in ("batches", "all") else []
    if cfg.workload in ("mixed", "all"):
        engines = [(name, LLM(d, **cfg.engine(d))) for name, d in models]
        run_mixed(engines, models[0][1], cfg.requests, cfg.max_prompt, cfg.max_new, cfg.hf_baselines)
    return rows


def sweep_config(batch_sizes: str | None, prompt_len: int, new_tokens: int, repeats: int | None, llamacpp: bool) -> SweepConfig:
    """The sweep's settings from the command line; what is not given takes the defaults of the sweep or of --llamacpp."""
    defaults = LLAMACPP_DEFAULTS if llamacpp else SWEEP_DEFAULTS
    return SweepConfig(parse_batch_sizes(batch_sizes or defaults["batch_sizes"]), prompt_len, new_tokens,
                       defaults["repeats"] if repeats is None else repeats)


def check_context(model_dirs: list[Path], cfg: BenchConfig) -> None:
    """Prompts longer than a model's context fail here, before any engine loads (one token is left to generate)."""
    longest = max(([cfg.sweep.prompt_len] if cfg.workload != "mixed" else []) + ([cfg.max_prompt] if cfg.workload != "batches" else []))
    for d in model_dirs:
        context = ModelConfig.from_hf(read_config(d)).max_position_embeddings
        if longest >= context:
            raise UserError(f"prompts of up to {longest} tokens do not fit the context of {d} ({context} tokens, one left "
                            f"to generate); pass a shorter --prompt-len or --max-prompt")


def labels(names: list[str]) -> list[str]:
    """Short names for the tables: each MODEL's last path component, unless two are the same."""
    short = [Path(n).name for n in names]
    return short if len(set(short)) == len(short) else names


def run_sweep(models: list[tuple[str, Path]], cfg: BenchConfig) -> list[list[dict]]:
    """The sweep of each model in turn, one engine loaded at a time (so peak RSS is that model's), then the tables."""
    s = cfg.sweep
    engine = EngineConfig().resolved(checkpoint_dtype(models[0][1]))  # the device and dtype the engines here run with
    bandwidth = copy_bandwidth(cfg.copy_bytes, device=engine.device)  # bytes/s
    gpu = GPUS[cfg.gpu]
    runs = f", the fastest of {s.repeats} runs per batch size" if s.repeats > 1 else ""
    print(f"batch sweep: {s.prompt_len}-token prompts, {s.new_tokens} new tokens each (greedy, ignore_eos){runs}, "
          f"{torch.get_num_threads()} threads, {engine.device} {engine.dtype}", flush=True)
    print(f"copy test: {bandwidth / 1e9:.1f} GB/s ({cfg.copy_bytes // MiB} MiB copied, best of 5); "
          f"--gpu {cfg.gpu}: {gpu.name}, {gpu.tbps} TB/s, {gpu.tflops} TFLOP/s", flush=True)
    results = [sweep_model(name, model_dir, bandwidth, cfg) for name, model_dir in models]
    print(sweep_table(results, cfg.gpu))
    if len(results) > 1:
        print(compare_table(results))
    if cfg.plot is not None:
        from compress.bench.plot import plot_throughput

        plot_throughput(results, cfg.gpu, cfg.plot)
        print(f"plot: {cfg.plot}")
    return results


def sweep_model(name: str, model_dir: Path, bandwidth: float, cfg: BenchConfig) -> list[dict]:
    llm = LLM(model_dir, **cfg.engine(model_dir))
    fp = footprint(llm, model_dir)
    print(f"{name}: holds {tensor_bytes(llm.runner.model) / MiB:.1f} MiB of weights and a {llm.runner.kv.nbytes / MiB:.1f} MiB "
          f"KV pool; a decode step reads {fp.read / MiB:.1f} MiB of weights here, {fp.stored / MiB:.1f} MiB as stored, "
          f"and {fp.kv_per_token / 1024:.1f} KiB per cached token ({cfg.sweep.context} per sequence on average)", flush=True)
    for line in llm.runner.cpu_kernels.lines() if llm.runner.cpu_kernels else []:  # the kernels chosen per row count (CPU)
        print(f"{name}: {line}", flush=True)
    results = sweep(llm, cfg.sweep)
    for r in results:
        if r.preemptions:
            print(f"{name}: {r.preemptions} preemptions at batch {r.batch} (the KV pool cannot hold the batch)", flush=True)
    rows = [roofline_row(name, r, fp, llm.runner.model.cfg, bandwidth, cfg) for r in results]
    del llm
    gc.collect()  # free this engine's weights and KV pool before the next model loads
    return rows


def roofline_row(name: str, r: BatchResult, fp: Footprint, model_cfg: ModelConfig, bandwidth: float, cfg: BenchConfig) -> dict:
    """A BatchResult with its bytes per token and the bounds of this machine and of cfg.gpu."""
    b, ctx, gpu = r.batch, cfg.sweep.context, GPUS[cfg.gpu]
    cpu_bound = tokens_per_s_bound(b, fp.step_bytes(b, ctx), 0.0, bandwidth / 1e12)
    gpu_bound = tokens_per_s_bound(b, fp.step_bytes(b, ctx, stored=True), b * decode_flops(model_cfg, ctx), gpu.tbps, gpu.tflops)
    kv = b * ctx * fp.kv_per_token  # the weights' share of a step: the routed experts' part only, for a MoE
    return dict(vars(r), name=name, weights_read=(fp.step_bytes(b, ctx) - kv) / b, weights_stored=(fp.step_bytes(b, ctx, stored=True) - kv) / b,
                kv_read=fp.kv_per_token * ctx, bound=cpu_bound, gpu_bound=gpu_bound)


def sweep_table(results: list[list[dict]], gpu: str) -> str:
    head = (f"| model | batch | TTFT p50 (ms) | ITL p50 / p99 (ms) | decode tok/s | peak RSS (MiB) | weights MiB/token read here (stored) "
            f"| KV MiB/token | bound here (tok/s) | of bound | {gpu} bound (tok/s) |\n|---|" + "---:|" * 10)
    lines = [f"| {r['name']} | {r['batch']} | {r['ttft50']:.0f} | {r['itl50']:.1f} / {r['itl99']:.1f} | {r['decode_tok_s']:.1f} "
             f"| {r['peak_rss']:.0f} | {r['weights_read'] / MiB:.1f} ({r['weights_stored'] / MiB:.1f}) | {r['kv_read'] / MiB:.2f} "
             f"| {r['bound']:.1f} | {100 * r['decode_tok_s'] / r['bound']:.0f} % | {r['gpu_bound']:,.0f} |"
             for rows in results for r in rows]
    return "\n".join([head, *lines])


def compare_table(results: list[list[dict]]) -> str:
    """Ratios of the second model to the first at each batch size."""
    first, other = results[0][0]["name"], results[1][0]["name"]
    head = (f"| batch | decode tok/s {first} | decode tok/s {other} | tok/s ratio | TTFT p50 ratio | ITL p50 ratio "
            f"| weights read here ratio | weights stored ratio | gpu bound ratio |\n|---|" + "---:|" * 8)
    lines = [f"| {a['batch']} | {a['decode_tok_s']:.1f} | {b['decode_tok_s']:.1f} | {b['decode_tok_s'] / a['decode_tok_s']:.2f}x "
             f"| {b['ttft50'] / a['ttft50']:.2f}x | {b['itl50'] / a['itl50']:.2f}x | {b['weights_read'] / a['weights_read']:.2f}x "
             f"| {b['weights_stored'] / a['weights_stored']:.2f}x | {b['gpu_bound'] / a['gpu_bound']:.2f}x |"
             for a, b in zip(*results)]
    return "\n".join([f"ratios: {other} / {first}", head, *lines])
