"""On the CPU path, a block's q/k/v projections become one Linear, and gate/up another (vLLM's
QKVParallelLinear and MergedColumnParallelLinear): they read the same input, so one call over the
rows of all of them replaces three (two), each with its Python dispatch and its threads' start and
barrier. SmolLM2-135M: 7 kernel calls a block become 4; 30 blocks of one decode row take 5.8 ms
instead of 7.3 at one thread (int8 activations, docs/results/speed.md). The joined weight holds the
parts' rows in order, so ``split`` / ``chunk`` of its output gives the parts' outputs exactly.

Only swapped Linears of one kind join (all CpuLinear, or all NibbleLinear / FiveLinear / SixLinear / ByteLinear with the same
group size, activations and form of scales); a GGUF's Q5_0 q/k beside a Q8_0 v (Q4_K_M) are widened to bytes and
join it as one ByteLinear, because the C decode step runs only blocks whose q/k/v are one Linear. Anything else (a
Linear left to torch, a dequantized PackedLinear) stays as it is.
"""

import torch
from torch import nn

from compress.model.arch import MLP_NAMES
from compress.runtime.cpu_modules import ByteLinear, CpuLinear, FiveLinear, GgufHeldLinear, NibbleLinear

# (the attribute of the joined Linear, the Linears a module reads one input with, the name a family that stores them
# joined gives them: Phi-3's qkv_proj / gate_up_proj are taken over as they are). Every module of a block that declares
# the joined attribute (Attention's qkv; the MLP's, and each MoE expert's and shared expert's, gate_up) is joined; an
# expert names its gate and up as its family does (``names``: Mixtral's w1, w3).
JOINS = (("qkv", lambda m: ("q_proj", "k_proj", "v_proj"), "qkv_proj"),
         ("gate_up", lambda m: getattr(m, "names", MLP_NAMES)[:2], "gate_up_proj"))


def _bias(parts: list[nn.Module]) -> torch.Tensor | None:
    return torch.cat([p.bias for p in parts]) if parts[0].bias is not None else None


def widened(parts: list[nn.Module]) -> list[nn.Module]:
    """parts, the FiveLinears among them as bytes where another part is a ByteLinear (the bytes cost those parts 3.5
    bits a weight; SmolLM2's Q4_K_M: 2.7 MiB a step)."""
    if not any(isinstance(p, ByteLinear) for p in parts):
        return parts
    return [p.as_bytes() if isinstance(p, FiveLinear) else p for p in parts]


def joinable(parts: list[nn.Module]) -> bool:
    first = parts[0]
    same = all(type(p) is type(first) and p.in_features == first.in_features and (p.bias is None) == (first.bias is None)
               for p in parts)
    if not same or not isinstance(first, (CpuLinear, NibbleLinear, GgufHeldLinear)):
        return False
    return isinstance(first, CpuLinear) or all(
        (p.group_size, p.int8_activations, p.form) == (first.group_size, first.int8_activations, first.form) for p in parts)


def joined(parts: list[nn.Module]) -> nn.Module:
    """One Linear computing the parts' outputs side by side; the parts' tensors are released."""
    first = parts[0]
    if isinstance(first, CpuLinear):
        return CpuLinear(torch.cat([p.weight.detach() for p in parts]), _bias(parts))  # [sum O, I]
    packed = {name: torch.cat([p.row_major()[name] for p in parts]) for name in type(first).NAMES}  # every part's rows, in order
    if isinstance(first, GgufHeldLinear):
        return type(first)(packed, _bias(parts), first.scratch)
    return NibbleLinear(packed, _bias(parts), first.scratch, first.int8_activations)


def join_projections(model: nn.Module) -> int:
    """Join each block's q/k/v and gate/up (each expert's, in a MoE layer) where they are joinable, in place;
    the number of joins made."""
    count = 0
    # One block's modules listed at a time: a list of every block's would keep every replaced part alive to the
    # end (Qwen3-8B int4: +2.4 GiB at the peak).
    for owner in (m for block in model.model.layers for m in list(block.modules())):
        for attr, names_of, stored in JOINS:
            if not hasattr(owner, attr):
                continue
            if hasattr(owner, stored):
                setattr(owner, attr, getattr(owner, stored))
                delattr(owner, stored)
                continue
            names = names_of(owner)
            parts = widened([getattr(owner, name) for name in names])
            if not joinable(parts):
                continue
            setattr(owner, attr, joined(parts))
            for name in names:
                delattr(owner, name)
            count += 1
    return count
