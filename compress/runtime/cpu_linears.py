"""The CPU path's Linears: every Linear swapped at engine start for one whose weight is packed for a C GEMM.

fp32 weights go into ``kernels/linear_cpu.py``'s panels (``PanelLinear``). int4/int3 ``PackedLinear``s
go into ``kernels/nibble_linear_cpu.py``'s 4-bit panels (``NibbleLinear``): the weight stays at about
5 bits a weight (codes, fp32 scale and offset per group) and decode reads that instead of a dense
fp32 copy. The reference path would unpack every weight on every forward, which dominates decode.
"""

from collections import Counter

import torch
from torch import nn

from compress.kernels import linear_cpu, nibble_linear_cpu
from compress.quant.linear import PackedLinear


def _bias(bias: torch.Tensor | None) -> nn.Parameter | None:
    return None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)


class PanelLinear(nn.Module):
    """A Linear whose fp32 weight is held packed for kernels/linear_cpu.py (the C GEMM), which runs every call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("panels", linear_cpu.pack(weight))
        self.bias = _bias(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear_cpu.linear(x, self.panels, self.out_features, self.bias)


class NibbleLinear(nn.Module):
    """An int4/int3 PackedLinear held as 4-bit panels for kernels/nibble_linear_cpu.py, fp32 activations."""

    def __init__(self, packed: PackedLinear):
        super().__init__()
        self.out_features, self.in_features = packed.out_features, packed.in_features
        codes, scales, offsets = nibble_linear_cpu.pack(*packed.codes())
        self.register_buffer("codes", codes)  # [P, I, 8] uint8
        self.register_buffer("scales", scales)  # [P, G, 16] fp32
        self.register_buffer("offsets", offsets)  # [P, G, 16] fp32
        self.bias = _bias(packed.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nibble_linear_cpu.linear(x, (self.codes, self.scales, self.offsets), self.out_features, self.bias)


def nibble_ready(m: PackedLinear) -> bool:
    return m.spec.bits <= 4 and m.weight_scale.dtype == torch.float32 and nibble_linear_cpu.supports(m.weight_scale)


def dense_linear(m: PackedLinear, weight: torch.Tensor) -> nn.Linear:
    """A plain Linear of m's dequantized weight: where no C kernel can run it."""
    new = nn.Linear(m.in_features, m.out_features, bias=m.bias is not None, device="meta")
    new.weight = nn.Parameter(weight, requires_grad=False)
    new.bias = _bias(m.bias)
    return new


def swap_one(m: nn.Module) -> nn.Module | None:
    """The module that replaces m on the CPU path, or None where m stays as it is."""
    if isinstance(m, PackedLinear):
        if nibble_ready(m):
            return NibbleLinear(m)
        weight = m.dequantized()
        return PanelLinear(weight, m.bias) if linear_cpu.supports(weight) else dense_linear(m, weight)
    return PanelLinear(m.weight.detach(), m.bias) if linear_cpu.supports(m.weight) else None


def cpu_linears(model: nn.Module) -> Counter:
    """Swap every Linear and int4/int3 PackedLinear (see the module doc) in place; returns how many
    PackedLinears kept 4-bit panels ("4-bit") and how many were dequantized ("dequantized"). A tied
    lm_head gets panels of its own; the embedding keeps the original. Where the C kernels cannot run
    (no compiler, not fp32) Linears stay as they are and PackedLinears become plain Linears of the
    dequantized weight."""
    packed: Counter = Counter()
    # Names, not modules: a list of the old modules would keep every one alive until the last is swapped.
    for name in [name for name, m in model.named_modules() if type(m) in (nn.Linear, PackedLinear)]:
        m = model.get_submodule(name)
        new = swap_one(m)
        if new is None:
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, new)
        if isinstance(m, PackedLinear):
            packed["4-bit" if isinstance(new, NibbleLinear) else "dequantized"] += 1
    return packed
