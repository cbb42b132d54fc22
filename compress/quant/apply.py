"""quantize(model, config): choose the method, decide what is quantized, swap the modules.

Only the Linears inside decoder layers are quantized; embeddings, norms and lm_head stay as
they are (as AutoAWQ and llm-compressor do by default).
"""

import torch

from compress.calib import BlockDone
from compress.errors import UserError
from compress.model.decoder import Decoder
from compress.quant.awq_apply import awq_quantize
from compress.quant.config import ACT_GROUPS, INT_METHODS, QuantConfig
from compress.quant.fp8 import Fp8Spec
from compress.quant.fp8_apply import fp8_quantize
from compress.quant.int8 import Int8Spec
from compress.quant.moe_calib import RoutedTokens
from compress.quant.primitives import DEFAULT_GROUP_SIZES, IntSpec, default_group_size
from compress.quant.static_apply import int8_quantize
# The swap helpers live in swap.py so that the methods import them one way.
from compress.quant.swap import Spec, each_block, quantize_block, quantized_linears


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
    """A model with experts is quantized symmetrically for compressed-tensors: transformers' and vLLM's MoE loaders
    read an expert's packed weights and scales, no zero points (llm-compressor's W4A16 for MoE is symmetric too)."""
    symmetric = cfg.symmetric or (model.cfg.moe is not None and cfg.format == "compressed-tensors")
    return IntSpec(cfg.bits, resolve_group_size(model, cfg.group_size), symmetric)


def int8_spec(model: Decoder, cfg: QuantConfig) -> Int8Spec:
    if cfg.outlier_topk is not None:
        narrow = min(m.in_features for m in quantized_linears(model).values())
        if cfg.outlier_topk > narrow:
            raise UserError(f"--outlier-topk {cfg.outlier_topk} is larger than the narrowest Linear input ({narrow} features)")
    return Int8Spec(cfg.outlier_threshold, cfg.outlier_topk, cfg.smooth_alpha, act_group(model, cfg.act_group_size))


def act_group(model: Decoder, size: int | None) -> int:
    """int8's x steps per block of ``size`` inputs (0: per token); None: the first of ACT_GROUPS dividing every input."""
    if size == 0:
        return 0
    sizes = ACT_GROUPS if size is None else (size,)
    widths = {m.in_features for m in quantized_linears(model).values()}
    g = default_group_size(widths, sizes)
    if g is None:
        raise UserError(f"--act-group-size {' or '.join(map(str, sizes))} does not divide every Linear's inputs "
                        f"({', '.join(map(str, sorted(widths)))}); pass --act-group-size 0 for one step per token")
    return g


def method_spec(model: Decoder, cfg: QuantConfig) -> Spec:
    """The spec of ``cfg`` for this model; options that do not fit the model fail here, before any work."""
    if cfg.method in INT_METHODS:
        return int_spec(model, cfg)
    if cfg.method == "int8":
        return int8_spec(model, cfg)
    return Fp8Spec(cfg.static_activations)


def quantize(model: Decoder, cfg: QuantConfig, calib: torch.Tensor | None = None, verbose: bool = False,
             done: BlockDone | None = None, routed: RoutedTokens | None = None) -> Spec:
    """Quantize ``model`` in place with the method of ``cfg``; returns the spec it used. ``done(i, block)`` is
    called as each block is finished (streaming export); a lazy model's block is released after it. ``routed``
    counts the tokens each expert's router chose in calibration (moe_calib.py)."""
    spec = method_spec(model, cfg)
    if cfg.method == "int8":
        int8_quantize(model, spec, calib, done, routed)
        return spec
    if cfg.method == "fp8":
        fp8_quantize(model, spec, calib, cfg.gptq, done, routed)
        return spec
    if cfg.method == "rtn":
        each_block(model, lambda block: quantize_block(block, spec), f"RTN int{spec.bits}", done)
        return spec
    awq_quantize(model, spec, cfg, calib, verbose, done, routed)
    return spec
