"""Decode steps on CPU as one C call over every block (``kernels/decode_step_cpu.py``).

A step whose rows are all decode rows (one new token per sequence, or a speculative verification's few)
runs the blocks in C when, at that row count, the engine's plans chose the C kernel for every op the loop
calls: the four Linears of a block, RMSNorm, the rotary embedding and decode attention
(``cpu_kernels``). Otherwise, and for prompts, the decoder's modules run as before. The loop calls the
same kernels, so the numbers are those of the module path except SiLU(gate) * up, computed in the loop
(within ~1e-7 relative of torch's).

Which models: fp32 activations, every block's gate/up joined (``cpu_fusion``) and its q/k/v joined or three held
Linears (a GGUF's types that join no Linear), all its Linears
without bias, and either all held (``NibbleLinear``, ``FiveLinear``, ``SixLinear``, ``ByteLinear``, each with its own kernel and group size: a
GGUF's mixture of block types) or all fp32 ``CpuLinear`` (their plans run torch at 1-3 rows on the hosts measured so far, so for them the step runs at a few rows
and up, where C was chosen), ``CpuRMSNorm`` norms, plain attention (no window or soft-cap), Llama's layout
or Qwen3's (its per-head q/k norms run in the loop through the same rms_norm kernel), no mixture of experts
(its routing runs in the modules). The embedding lookup, the rotary tables and the lm_head stay in Python
(once a step).
"""

import torch
from torch import nn

from compress.kernels import (byte_q8_cpu, decode_step_cpu, linear_cpu, nibble_linear_cpu, nibble_q8_cpu, paged_attention_cpu,
                              rms_norm_cpu, rope_cpu)
from compress.model.arch import Norms
from compress.model.config import ModelConfig
from compress.runtime.attention import AttentionMetadata
from compress.runtime.cpu_linears import op_of
from compress.runtime.cpu_modules import ByteLinear, CpuLinear, GgufHeldLinear, NibbleLinear
from compress.runtime.cpu_norms import CpuRMSNorm, use_c


def block_modules(block: nn.Module) -> list[nn.Module | None]:
    """A block's modules in the loop's table order: the two norms, then q/k/v (or q), o, gate/up, down, then k and v
    where q/k/v are not joined (None where they are)."""
    attn, mlp = block.self_attn, block.mlp
    first, k, v = (attn.qkv, None, None) if attn.qkv is not None else (attn.q_proj, attn.k_proj, attn.v_proj)
    return [block.input_layernorm, block.post_attention_layernorm, first, attn.o_proj, mlp.gate_up, mlp.down_proj, k, v]


def qk_norms(block: nn.Module) -> list[torch.Tensor]:
    """The q and k norms' weights of a block (its input norm's twice where it has none: unused by the loop)."""
    attn = block.self_attn
    return [attn.q_norm.weight, attn.k_norm.weight] if attn.qk_norm else [block.input_layernorm.weight] * 2


def simple_layers(cfg: ModelConfig) -> bool:
    """Layers the C loop runs: Llama's norms (x * w), q/k norms per head or none, no multipliers, SiLU, full
    rotation by one table, plain attention, a dense MLP in every layer (the loop calls the kernels Llama's and
    Qwen3's layers need)."""
    arch = cfg.arch
    return (cfg.moe is None and arch.norms == Norms() and arch.qk_norm in (None, "head") and not arch.norm_offset
            and cfg.plain_attention() and cfg.hidden_act == "silu" and cfg.residual_multiplier == 1.0 and cfg.local_rope is None
            and cfg.partial_rotary_factor == 1.0)


def eligible(model: nn.Module) -> bool:
    """Whether every block has the modules the C loop runs (see the module's docstring)."""
    if not simple_layers(model.cfg) or decode_step_cpu.load() is None:
        return False
    if not all(getattr(b.mlp, "gate_up", None) is not None for b in model.model.layers):
        return False
    linears = [m for b in model.model.layers for m in block_modules(b)[2:] if m is not None]
    norms = [m for b in model.model.layers for m in block_modules(b)[:2]] + [model.model.norm]
    if not all(isinstance(m, (NibbleLinear, GgufHeldLinear, CpuLinear)) and m.bias is None for m in linears) or not all(isinstance(m, CpuRMSNorm) for m in norms):
        return False
    return len({isinstance(m, CpuLinear) for m in linears}) == 1 and len({m.eps for m in norms}) == 1


def gemm(m: nn.Module) -> int:
    """The address of a held Linear's C GEMM, in the 4-bit kernels' calling convention."""
    if isinstance(m, ByteLinear):
        return decode_step_cpu.address(byte_q8_cpu.load(), "step_linear")
    if m.int8_activations:
        return decode_step_cpu.address(nibble_q8_cpu.load(), nibble_q8_cpu.ENTRIES[m.form])
    return decode_step_cpu.address(nibble_linear_cpu.load(), "linear")


class DecodeStep:
    """``step(ids, meta)`` -> final-norm hidden states [1, R, C] of a decode-only step, in one C call."""

    def __init__(self, model: nn.Module, kv: torch.Tensor):
        """model: eligible (``eligible``); kv: the runner's cache [2, L, NB, BS, KVH, D]."""
        cfg, blocks = model.cfg, model.model.layers
        self.model, self.kv = model, kv
        modules = [m for b in blocks for m in block_modules(b) if m is not None]
        self.ops = list({op_of(m) if not isinstance(m, CpuRMSNorm) else "norm": m for m in modules}.values())  # one per plan
        ptrs = [p for b in blocks for p in [*(p for m in block_modules(b) for p in self._entries(m)), *(t.data_ptr() for t in qk_norms(b))]]
        self.ptrs = torch.tensor(ptrs + [model.model.norm.weight.data_ptr()], dtype=torch.int64)
        dense = isinstance(modules[2], CpuLinear)
        self.fns = torch.tensor([decode_step_cpu.address(linear_cpu.load(), "linear") if dense else 0,
                                 decode_step_cpu.address(rms_norm_cpu.load(), "rms_norm"),
                                 decode_step_cpu.address(rope_cpu.load(), "rope"),
                                 decode_step_cpu.address(paged_attention_cpu.load(), "paged_attention")], dtype=torch.int64)
        self.dims = torch.tensor([cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                                  kv.shape[3], kv.shape[2], 0, cfg.num_layers, int(dense), int(cfg.arch.qk_norm is not None)],
                                 dtype=torch.int32)
        self.eps, self.scale = blocks[0].input_layernorm.eps, cfg.scale()
        self.scratch = torch.empty(0)  # grown to the most rows a step has had

    @staticmethod
    def _entries(m: nn.Module) -> list[int]:
        """A module's entries in the table: a norm's weight; a Linear's LINS (decode_step_cpu), zeros for None."""
        if m is None:
            return [0] * decode_step_cpu.LINS
        if isinstance(m, CpuRMSNorm):
            return [m.weight.data_ptr()]
        if isinstance(m, CpuLinear):
            return [m.weight.data_ptr()] + [0] * (decode_step_cpu.LINS - 1)
        tensors = [t.data_ptr() for t in m.packed]  # codes, scales (, offsets)
        return tensors + [0] * (3 - len(tensors)) + [gemm(m), m.scales.shape[1]]

    def takes(self, meta: AttentionMetadata, rows: int, attention_c: bool, rope_c: bool) -> bool:
        """Whether a step of ``rows`` rows with this metadata runs here: all decode rows, C chosen for the norms,
        and for every Linear a C kernel within kernel_choice.FUSE_MARGIN of its fastest (``fuse_c``)."""
        if len(meta.decode_rows) != rows or meta.prefills or not (attention_c and rope_c):
            return False
        return all(use_c(m.use_c if isinstance(m, CpuRMSNorm) else m.fuse_c, rows) for m in self.ops)

    @torch.inference_mode()
    def __call__(self, ids: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        """ids [1, R] -> final-norm hidden states [1, R, C] (the K/V of the new tokens written into the cache)."""
        model = self.model
        x = model.embed(ids).float().contiguous()  # [1, R, C]
        cos, sin = (t.contiguous() for t in model.rope(meta.positions[None], x.dtype, meta.lengths[None]))  # [1, R, D]
        tables, lens = meta.decode_tables.contiguous(), meta.decode_lens.contiguous()
        paged_attention_cpu.check_bounds(self.kv[0, 0], tables, lens)
        self.dims[7] = tables.shape[1]
        out, rows, cfg = torch.empty_like(x), ids.shape[1], model.cfg
        need = decode_step_cpu.scratch_floats(rows, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim)
        if self.scratch.numel() < need:
            self.scratch = torch.empty(need)
        failed = decode_step_cpu.load().decode_step(
            x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), meta.slots.data_ptr(), tables.data_ptr(),
            lens.data_ptr(), self.kv.data_ptr(), self.ptrs.data_ptr(), self.fns.data_ptr(), self.dims.data_ptr(),
            self.eps, self.scale, self.scratch.data_ptr(), rows, torch.get_num_threads())
        if failed:
            raise MemoryError("the CPU decode step could not allocate its kernels' buffers")
        return out
