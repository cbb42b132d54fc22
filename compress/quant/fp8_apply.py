"""Apply fp8: e4m3 weights by GPTQ (fp8_gptq.py) or nearest rounding, activations per token or one static scale.

What calibration records, block by block as for the other methods (each block sees the outputs of the already
quantized blocks before it, activations rounded to e4m3 too): for GPTQ, the second moments E[x x^T] of each
scale group's input (one per group: q, k, v share theirs, as gate and up do); for static activations, max |x|
per input dim of every Linear. fp8.py and fp8_gptq.py compute; the model changes here.
"""

import torch
from torch import nn
from tqdm import tqdm

from compress.calib import BlockDone, block_inputs, blocks, compute_device, record_absmax, record_inputs, run_block
from compress.errors import UserError
from compress.model.arch import ScaleGroup
from compress.model.decoder import Decoder
from compress.quant.awq_apply import quantized
from compress.quant.fp8 import Fp8Spec, input_scale
from compress.quant.fp8_gptq import fp8_gptq
from compress.quant.gptq import prepare
from compress.quant.linear import Fp8Linear
from compress.quant.moe_calib import RoutedTokens, all_experts
from compress.quant.swap import each_block, swap_linears


def fp8_linear(linear: nn.Linear, weights: tuple[torch.Tensor, torch.Tensor] | None,
               absmax: torch.Tensor | None) -> Fp8Linear:
    """Fp8Linear of ``linear`` holding ``weights`` (e4m3 [O, I], scale [O, 1]) if given, else its nearest rounding;
    a static input scale from the calibration max |x| [I] if given."""
    new = Fp8Linear.from_float(linear, None if absmax is None else input_scale(absmax, linear.weight.dtype))
    if weights is not None:
        new.weight.copy_(weights[0])
        new.weight_scale.copy_(weights[1])
    return new


def gptq_weights(block: nn.Module, grams: dict[str, torch.Tensor], groups: tuple[ScaleGroup, ...]) -> dict:
    """Name -> ``fp8_gptq``'s (e4m3, scale) for every quantized Linear of the block; ``grams``: E[x x^T] [I, I] by
    group module. One factorization of H per group, shared by its Linears."""
    out = {}
    for g in groups:
        h = grams[g.module]
        prepared = prepare(h)
        for name in quantized(block, g):
            out[name] = fp8_gptq(block.get_submodule(name).weight.detach(), h, prepared)
    return out


def fp8_quantize(model: Decoder, spec: Fp8Spec, calib: torch.Tensor | None, gptq: bool, done: BlockDone | None = None,
                 routed: RoutedTokens | None = None) -> None:
    """Fp8Linear everywhere, weights by GPTQ if ``gptq``; ``calib`` may be None only for nearest rounding with
    dynamic activations (nothing to calibrate)."""
    if not gptq and not spec.static_activations:
        each_block(model, lambda block: swap_linears(block, lambda _, lin: Fp8Linear.from_float(lin)), "fp8", done)
        return
    if calib is None:
        raise UserError("fp8 with GPTQ rounding or static activations needs calibration tokens (or rounding='nearest')")
    device = compute_device()
    x = block_inputs(model, calib, device)  # [N, T, C]
    positions = torch.arange(x.shape[1], device=device)[None]  # [1, T]
    desc = "fp8 GPTQ" if gptq else "fp8 input scales"
    for i, block in tqdm(blocks(model, device, done), total=model.cfg.num_layers, desc=desc, unit="block"):
        model.prepare(positions, x.dtype)
        groups = [g for g in model.cfg.layer_groups(i) if quantized(block, g)]  # not those kept unquantized
        with all_experts(block, f"model.layers.{i}.", routed):
            absmax = record_absmax(block, x, list(block.linears)) if spec.static_activations else {}
            feats = record_inputs(block, x, [g.module for g in groups], 0, 0, 0, gram=True) if gptq else {}
        weights = gptq_weights(block, {n: f["gram"] for n, f in feats.items()}, groups) if gptq else {}
        swap_linears(block, lambda name, lin: fp8_linear(lin, weights[name] if gptq else None, absmax.get(name)))
        x = run_block(block, x)
