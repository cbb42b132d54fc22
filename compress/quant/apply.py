"""quantize(model, config): choose the method, decide what is quantized, swap the modules.

Only the Linears inside decoder layers are quantized; embeddings, norms and lm_head stay as
they are (as AutoAWQ and llm-compressor do by default).
"""

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from compress.calib import BlockDone, blocks, compute_device
from compress.errors import UserError
from compress.model.arch import LAYER_LINEARS
from compress.model.decoder import Decoder
from compress.quant.config import INT_METHODS, QuantConfig
from compress.quant.fp8 import Fp8Spec
from compress.quant.int8 import Int8Spec
from compress.quant.linear import PackedLinear
from compress.quant.primitives import DEFAULT_GROUP_SIZES, IntSpec, default_group_size

Spec = IntSpec | Int8Spec | Fp8Spec  # what a method produced: enough to write and describe it


def layer_linears(block: nn.Module) -> dict[str, nn.Module]:
    return {name: block.get_submodule(name) for name in LAYER_LINEARS}


def quantized_linears(model: Decoder) -> dict[str, nn.Module]:
    """Full name -> module of every Linear that quantization replaces."""
    return {
        f"model.layers.{i}.{name}": mod
        for i, block in enumerate(model.model.layers)
        for name, mod in layer_linears(block).items()
    }


def resolve_group_size(model: Decoder, requested: int | None) -> int:
    """The requested group size if it divides every in_features, else the default rule."""
    widths = {name: m.in_features for name, m in quantized_linears(model).items()}
    sizes = sorted(set(widths.values()))
    if requested is not None:
        bad = sorted({f"{name.split('.')[-1]} (in_features {w})" for name, w in widths.items() if w % requested})
        if bad:
            fits = [g for g in (256, 128, 64, 32, 16) if all(w % g == 0 for w in sizes)]
            raise UserError(
                f"--group-size {requested} does not divide the input width of {', '.join(bad)}; "
                f"group sizes that work: {', '.join(map(str, fits)) or 'none of 256..16'}"
            )
        return requested
    g = default_group_size(set(sizes))
    if g is None:
        raise UserError(f"no group size of {DEFAULT_GROUP_SIZES} divides the Linear input widths {sizes}; pass --group-size")
    return g


def int_spec(model: Decoder, cfg: QuantConfig) -> IntSpec:
    return IntSpec(cfg.bits, resolve_group_size(model, cfg.group_size), cfg.symmetric)


def int8_spec(model: Decoder, cfg: QuantConfig) -> Int8Spec:
    if cfg.outlier_topk is not None:
        narrow = min(m.in_features for m in quantized_linears(model).values())
        if cfg.outlier_topk > narrow:
            raise UserError(f"--outlier-topk {cfg.outlier_topk} is larger than the narrowest Linear input ({narrow} features)")
    return Int8Spec(cfg.outlier_threshold, cfg.outlier_topk, cfg.smooth_alpha)


def method_spec(model: Decoder, cfg: QuantConfig) -> Spec:
    """The spec of ``cfg`` for this model; options that do not fit the model fail here, before any work."""
    if cfg.method in INT_METHODS:
        return int_spec(model, cfg)
    if cfg.method == "int8":
        return int8_spec(model, cfg)
    return Fp8Spec(cfg.static_activations)


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


def quantize(model: Decoder, cfg: QuantConfig, calib: torch.Tensor | None = None, verbose: bool = False,
             done: BlockDone | None = None) -> Spec:
    """Quantize ``model`` in place with the method of ``cfg``; returns the spec it used. ``done(i, block)`` is
    called as each block is finished (streaming export); a lazy model's block is released after it."""
    spec = method_spec(model, cfg)
    if cfg.method in ("int8", "fp8"):
        from compress.quant.static_apply import fp8_quantize, int8_quantize

        (int8_quantize if cfg.method == "int8" else fp8_quantize)(model, spec, calib, done)
        return spec
    if cfg.method == "rtn":
        each_block(model, lambda block: quantize_block(block, spec), f"RTN int{spec.bits}", done)
        return spec
    from compress.quant.awq_apply import awq_quantize

    awq_quantize(model, spec, cfg, calib, verbose, done)
    return spec
