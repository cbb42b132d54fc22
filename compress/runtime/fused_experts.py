"""On CUDA, a mixture-of-experts block's routed experts in one fused Triton kernel (``kernels/fused_moe.py``,
vLLM's fused_moe) instead of three dequant-matmuls per chosen expert.

Which blocks: at engine start ``fuse_experts`` gives every ``SparseMoe`` whose routed experts are all int4
``PackedLinear`` s of one spec (bits 4, one group size that is a multiple of 16, symmetric or not, no bias, one
scale dtype), held on a device in ``DEVICES``, a ``FusedExperts`` as its ``fused``; the block then calls it for
the routed sum and runs the router and the shared expert (Qwen2-MoE) as before. Anything else (fp32, int3, int8,
fp8 experts, the CPU path's swapped Linears) keeps the per-expert path. ``DEVICES`` is CUDA; a test adds "cpu"
to run the kernel under ``TRITON_INTERPRET=1``.

Memory: one copy. Each buffer kind (packed codes, scales, zero points) of every expert is copied into the
kernel's stacked layout ([E, 2I, ...]: gate rows then up rows; [E, C, ...]: down) one expert at a time, and the
expert's ``PackedLinear`` buffer becomes a view of its rows there, so each per-expert tensor is freed as soon as it
is copied (the transient peak is one buffer kind of one layer) and the per-expert path (``block.fused = None``)
still runs, on the same bytes. The stacks are not registered buffers: ``state_dict`` sees the experts' views only.
"""

import torch

from compress.kernels import fused_moe as kernel
from compress.model.moe import SparseMoe
from compress.quant.linear import PackedLinear

DEVICES = {"cuda"}  # device types whose int4 experts are fused; tests add "cpu" under TRITON_INTERPRET=1
BUFFERS = ("weight_packed", "weight_scale", "weight_zero_point")


def fusable(block: SparseMoe) -> bool:
    """Whether every routed expert's gate, up and down are int4 PackedLinears of one spec the kernel reads, on a
    device in DEVICES (the CPU path has already swapped its Linears: they are not PackedLinears there)."""
    parts = [getattr(e, n, None) for e in block.experts for n in e.names]  # None: joined on the CPU path (gate_up)
    first = parts[0]
    if not all(type(p) is PackedLinear for p in parts):
        return False
    return (first.spec.bits == 4 and first.spec.group_size % 16 == 0 and first.weight_packed.device.type in DEVICES
            and all(p.spec == first.spec and p.bias is None and p.weight_scale.dtype == first.weight_scale.dtype
                    for p in parts))


def stack(parts: list[list[PackedLinear]], name: str) -> torch.Tensor:
    """Buffer ``name`` of every expert's parts, [E, rows of the parts one after another, ...]; each part's buffer
    is then a view of its rows in the stack (the expert's own tensor freed as soon as it is copied)."""
    first = [getattr(p, name) for p in parts[0]]
    rows = [t.shape[0] for t in first]
    out = first[0].new_empty(len(parts), sum(rows), *first[0].shape[1:])
    for e, expert in enumerate(parts):
        start = 0
        for part, n in zip(expert, rows):
            out[e, start:start + n].copy_(getattr(part, name))
            setattr(part, name, out[e, start:start + n])
            start += n
    return out


class FusedExperts:
    """The routed experts' weighted sum over stacked int4 experts; a plain object, not a module (its stacks are the
    experts' own buffers, which ``state_dict`` and ``.to`` already see through the views)."""

    def __init__(self, block: SparseMoe):
        names = block.experts[0].names
        gate_up = [[getattr(e, names[0]), getattr(e, names[1])] for e in block.experts]
        down = [[getattr(e, names[2])] for e in block.experts]
        symmetric = gate_up[0][0].spec.symmetric
        # gate_up: packed [E, 2I, C/8], scale [E, 2I, C/g], zero [E, 2I/8, C/g]; down: [E, C, I/8], [E, C, I/g], [E, C/8, I/g]
        self.gate_up, self.down = (tuple(None if symmetric and b == BUFFERS[2] else stack(parts, b) for b in BUFFERS)
                                   for parts in (gate_up, down))

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        """out [N, C] = sum_k weights[:, k] * expert_{experts[:, k]}(x) of x [N, C], weights and experts [N, K]."""
        return kernel.fused_moe_int4(x, self.gate_up, self.down, experts, weights.float())

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.gate_up, *self.down) if t is not None)


def fuse_experts(model: torch.nn.Module) -> list[FusedExperts]:
    """Give every fusable SparseMoe of model its FusedExperts (see the module doc); returns them."""
    fused = []
    for block in (m for m in model.modules() if isinstance(m, SparseMoe)):
        if fusable(block):
            block.fused = FusedExperts(block)
            fused.append(block.fused)
    return fused
