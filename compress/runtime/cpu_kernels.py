"""The CPU path's kernels, chosen at engine start: every Linear swapped (``cpu_linears``), decode
attention, and the RMSNorms and rotary embedding (``cpu_norms``), each running the kernel measured fastest at each row count on this machine
(``kernel_choice``), and the ``runtime:`` lines that say what was chosen.

Decode attention is timed as a step's call for one layer: ``rows`` sequences (one new token each)
of up to CONTEXT tokens (fewer where that would read more than KV_BYTES), their blocks scattered
over the pool, the C kernel (``kernels/paged_attention_cpu.py``) against ``PagedAttention``'s torch
path (grouped gather + SDPA), at each bucket of 1..max_num_seqs rows; more rows (speculative
verification) take the choice at max_num_seqs.
"""

import time
from dataclasses import dataclass

import torch
from torch import nn

from compress.kernels import paged_attention_cpu, rope_cpu
from compress.model.config import ModelConfig
from compress.runtime import weight_arena
from compress.runtime.attention import AttentionMetadata, PagedAttention
from compress.runtime.config import EngineConfig
from compress.runtime.cpu_fusion import join_projections
from compress.runtime.cpu_linears import Swapped, cpu_linears, group_modules, swapped_modules
from compress.runtime.cpu_norms import CpuRMSNorm, norm_candidates, norm_op, rope_candidates, rope_op, swap_norms, use_c
from compress.runtime.kernel_choice import C, TORCH, Plan, Timings, time_candidates
from compress.runtime.linear_timing import candidates

CONTEXT = 256
KV_BYTES = 64 << 20

FALLBACK = "torch ops (not fp32, COMPRESS_CPU_KERNELS=0, or no working C compiler: set CC)"


def decode_candidates(cfg: ModelConfig, block_size: int, rows: int) -> dict:
    """The C kernel and torch's path, each one layer's decode attention over `rows` sequences (the first layer's
    window and the model's scale and soft-cap)."""
    per_token = 2 * cfg.num_kv_heads * cfg.head_dim * 4  # K and V, fp32
    context = max(1, min(CONTEXT, KV_BYTES // (rows * per_token)))
    blocks = -(-context // block_size)
    gen = torch.Generator().manual_seed(0)
    kv = torch.randn(2, 1, rows * blocks, block_size, cfg.num_kv_heads, cfg.head_dim, generator=gen)
    order = torch.randperm(rows * blocks, generator=gen).tolist()
    tables = [order[i * blocks:(i + 1) * blocks] for i in range(rows)]
    meta = AttentionMetadata.build([context - 1] * rows, [1] * rows, tables, block_size, "cpu")
    q = torch.randn(1, rows, cfg.num_heads, cfg.head_dim, generator=gen)
    k, v = (torch.randn(1, rows, cfg.num_kv_heads, cfg.head_dim, generator=gen) for _ in range(2))
    spec = cfg.attention()
    backends = {C: PagedAttention(kv, meta, spec, cpu_kernel=True), TORCH: PagedAttention(kv, meta, spec, cpu_kernel=False)}
    return {name: (lambda b=b: b(0, q, k, v)) for name, b in backends.items()}


def attention_op(cfg: ModelConfig, block_size: int) -> str:
    softcap = " softcap" if cfg.attention().softcap is not None else ""  # the cap's pass costs the C kernel time
    return f"attention {cfg.num_heads}x{cfg.num_kv_heads}x{cfg.head_dim} block {block_size} context {CONTEXT} kv {KV_BYTES}{softcap}"


@dataclass
class CpuKernels:
    linears: Swapped
    attention: Plan | None  # None: decode attention always takes torch's path (no C kernel)
    measured: int  # buckets timed at this start (the others came from the cache)
    skipped: int  # buckets left untimed (budget spent, or too noisy): they take the nearest timed bucket's choice
    seconds: float  # spent timing at this start (not the swap, which takes longer for an 8B model)
    norms: tuple[list[CpuRMSNorm], Plan] | None = None  # the swapped RMSNorms and their plan (None: none swapped)
    rope: Plan | None = None  # None: q and k are rotated by torch's ops

    def __post_init__(self):
        self.attention_table = self.attention.table() if self.attention is not None else [False]
        self.rope_table = self.rope.table() if self.rope is not None else [False]

    def attention_c(self, rows: int) -> bool:
        """Whether a step with `rows` decode rows runs the C attention kernel."""
        return use_c(self.attention_table, rows)

    def rope_c(self, rows: int) -> bool:
        """Whether a step of `rows` tokens rotates q and k in the C kernel."""
        return use_c(self.rope_table, rows)

    def lines(self) -> list[str]:
        """What was chosen, one line per Linear shape and one for attention (printed after "runtime: ")."""
        skipped = f", {self.skipped} untimed (time budget spent or a busy machine; timed at the next start)" if self.skipped else ""
        out = [f"kernels chosen against torch at {torch.get_num_threads()} threads: {self.measured} row counts timed now "
               f"({self.seconds:.1f} s){skipped}, the rest cached"] if self.linears.groups else []
        if self.linears.joins:
            out.append(f"q/k/v and gate/up projections joined into one Linear each ({self.linears.joins} joins)")
        out += [g.describe() for g in self.linears.groups]
        if scratch := self.linears.scratch_bytes():
            out.append(f"Linears held in 4 or 8 bits dequantize into one {scratch / 2**20:.1f} MiB scratch buffer "
                       "where torch's GEMM runs them")
        if self.linears.huge_pages:
            out.append(f"held weights in one buffer on 2 MiB pages ({self.linears.huge_pages / 2**20:.1f} MiB)")
        if self.linears.dequantized:
            out.append(f"{self.linears.dequantized} int4/int3 Linears dequantized once (no 4-bit CPU kernel for them here)")
        if not self.linears.groups:
            out.append(f"matmuls run {FALLBACK}")
        out.append(f"decode attention: {self.attention.describe() if self.attention else FALLBACK}")
        if self.norms is not None:
            out.append(f"rms_norm ({len(self.norms[0])}): {self.norms[1].describe()}")
        if self.rope is not None:
            out.append(f"rotary embedding: {self.rope.describe()}")
        return out


def choose(model: nn.Module, config: EngineConfig, timings: Timings | None = None) -> CpuKernels:
    """Swap model's Linears and choose every kernel per row count, timing what ``timings`` (the cache) lacks."""
    timings = timings or Timings()
    linears = cpu_linears(model, config.cpu_lm_head, config.cpu_int8_activations)
    # The groups hold the q/k/v and gate/up about to be joined: dropped first, each block's parts are freed as it
    # is joined (an 8B int4 model otherwise held every part and every joined copy at once: +2.3 GiB at the peak).
    linears.groups = []
    linears.joins = join_projections(model)
    linears.groups = group_modules(swapped_modules(model))
    linears.huge_pages = weight_arena.gather(model)  # before the decode step's table takes the tensors' addresses
    for g in linears.groups:
        timings.request(g.op, config.max_num_batched_tokens, g.preferred, lambda rows, g=g: time_candidates(candidates(g, rows)))
    cfg = model.cfg
    attention = paged_attention_cpu.supports(torch.empty(0, dtype=config.torch_dtype))
    if attention:
        timings.request(attention_op(cfg, config.block_size), config.max_num_seqs, TORCH,
                        lambda rows: time_candidates(decode_candidates(cfg, config.block_size, rows)))
    norms = swap_norms(model)
    if norms:
        width = norms[0].weight.shape[0]
        timings.request(norm_op(width), config.max_num_batched_tokens, TORCH, lambda rows: time_candidates(norm_candidates(width, rows)))
    rope = rope_cpu.load() is not None and config.torch_dtype == torch.float32
    if rope:
        timings.request(rope_op(cfg), config.max_num_batched_tokens, TORCH, lambda rows: time_candidates(rope_candidates(cfg, rows)))
    start = time.monotonic()
    plans = timings.plans()
    seconds = time.monotonic() - start  # the timing alone (the swap of an 8B model's Linears takes longer)
    for g in linears.groups:
        g.apply(plans[g.op])
    for norm in norms:
        norm.use_c = plans[norm_op(width)].table()
    timings.save()
    attention_plan = plans[attention_op(cfg, config.block_size)] if attention else None
    return CpuKernels(linears, attention_plan, timings.measured, timings.skipped, seconds,
                      (norms, plans[norm_op(width)]) if norms else None, plans[rope_op(cfg)] if rope else None)
