"""Which Linears quantization replaces, and the in-place swap of one decoder block's Linears.

The methods (apply.py, awq_apply.py, static_apply.py, fp8_apply.py) and the formats (export.py, awq_format.py)
all import from here; nothing here imports them, so the quant modules import one way.
"""

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from compress.calib import BlockDone, blocks, compute_device
from compress.model.decoder import Decoder
from compress.quant.fp8 import Fp8Spec
from compress.quant.int8 import Int8Spec
from compress.quant.linear import GgufSpec, PackedLinear
from compress.quant.primitives import IntSpec

Spec = IntSpec | Int8Spec | Fp8Spec | GgufSpec  # what a method produced (or a GGUF read kept): enough to write and describe it


def layer_linears(block: nn.Module) -> dict[str, nn.Module]:
    """Name -> module of the block's own Linears, as its family stores them (Phi-3's fused qkv_proj, ...)."""
    return {name: block.get_submodule(name) for name in block.linears}


def quantized_linears(model: Decoder) -> dict[str, nn.Module]:
    """Full name -> module of every Linear that quantization replaces."""
    return {
        f"model.layers.{i}.{name}": mod
        for i, block in enumerate(model.model.layers)
        for name, mod in layer_linears(block).items()
    }


def swap_linears(block: nn.Module, make: Callable[[str, nn.Linear], nn.Module]) -> None:
    """Replace every Linear of one decoder layer with ``make(name, linear)`` (in place)."""
    for name, linear in layer_linears(block).items():
        parent, _, child = name.rpartition(".")
        setattr(block.get_submodule(parent), child, make(name, linear))


def quantize_block(block: nn.Module, spec: IntSpec, params: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
                   codes: dict[str, torch.Tensor] | None = None) -> None:
    """Round every Linear of one decoder layer to ``spec``, with the (scale, zero) of ``params`` and the codes
    of ``codes`` (a search's choice instead of nearest rounding) where they have them."""
    params, codes = params or {}, codes or {}
    swap_linears(block, lambda name, lin: PackedLinear.from_float(lin, spec, params.get(name), codes.get(name)))


def each_block(model: Decoder, fn: Callable[[nn.Module], None], desc: str, done: BlockDone | None = None) -> None:
    """``fn(block)`` on every decoder block in turn (read from disk one at a time for a lazy model), then ``done(i, block)``."""
    for _, block in tqdm(blocks(model, compute_device(), done), total=model.cfg.num_layers, desc=desc, unit="block"):
        fn(block)
