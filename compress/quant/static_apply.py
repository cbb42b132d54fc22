"""Apply int8 with outlier split, the method calibrated by one statistic (fp8 is applied in fp8_apply.py).

Its calibration is one number per input dim of every Linear (max |x| over the calibration
set), recorded block by block like AWQ's: each block sees the outputs of the already
quantized blocks before it. int8.py computes from the statistics; the model changes here.
"""

from collections.abc import Callable

import torch
from torch import nn
from tqdm import tqdm

from compress.calib import BlockDone, block_inputs, blocks, compute_device, record_absmax, run_block
from compress.model.arch import ScaleGroup
from compress.model.decoder import Decoder, RMSNorm
from compress.quant.awq_apply import fold_scales
from compress.quant.int8 import Int8Spec, outlier_dims
from compress.quant.linear import Int8OutlierLinear
from compress.quant.moe_calib import RoutedTokens, all_experts
from compress.quant.smooth import smooth_scales
from compress.quant.swap import each_block, swap_linears

MakeLinear = Callable[[str, nn.Linear, torch.Tensor], nn.Module]  # (name, linear, max |x| [I]) -> module
Transform = Callable[[nn.Module, dict[str, torch.Tensor], tuple[ScaleGroup, ...]], None]  # (block, max |x| by name, its
# scale groups): changes the block and the statistics in place


def calibrated_swap(model: Decoder, calib: torch.Tensor, make: MakeLinear, desc: str, transform: Transform | None = None,
                    done: BlockDone | None = None, routed: RoutedTokens | None = None) -> dict[str, torch.Tensor]:
    """Swap every decoder Linear for ``make(name, linear, absmax)`` (after ``transform`` of the
    block and its statistics); returns the statistics the swap used, by full name. Every expert is
    calibrated on every token (moe_calib.py); ``routed`` counts the tokens the routers chose."""
    device = compute_device()
    x = block_inputs(model, calib, device)  # [N, T, C]
    positions = torch.arange(x.shape[1], device=device)[None]  # [1, T]
    stats = {}
    for i, block in tqdm(blocks(model, device, done), total=model.cfg.num_layers, desc=desc, unit="block"):
        model.prepare(positions, x.dtype)
        with all_experts(block, f"model.layers.{i}.", routed):
            absmax = record_absmax(block, x, list(block.linears))
        if transform is not None:
            transform(block, absmax, model.cfg.layer_groups(i))
        swap_linears(block, lambda name, lin: make(name, lin, absmax[name]))
        x = run_block(block, x)
        stats.update({f"model.layers.{i}.{name}": a.cpu() for name, a in absmax.items()})
    return stats


def smooth_block(alpha: float) -> Transform:
    """SmoothQuant on the Linears fed by an RMSNorm (q,k,v and gate,up; Phi-3's fused qkv and gate_up): the scales
    fold into the norm's weight exactly (of either form, x * w or x * (1 + w)), and the statistics become those of
    the smoothed inputs. Groups with no norm before them (OLMo 2's) are left as they are; a MoE layer's routers take the
    scale too (routing unchanged), and have no statistics (they stay unquantized)."""

    @torch.no_grad()
    def transform(block: nn.Module, absmax: dict[str, torch.Tensor], groups: tuple[ScaleGroup, ...]) -> None:
        for g in groups:
            if g.prev is None or not isinstance(block.get_submodule(g.prev), RMSNorm):
                continue  # a Linear-fed group: its scale would move error into the previous int8 Linear
            seen = [n for n in g.linears if n in absmax]  # the group's quantized Linears (--ignore keeps some plain)
            if not seen:
                continue
            w_absmax = torch.stack([block.get_submodule(n).weight.abs().amax(0).float() for n in g.linears]).amax(0)  # [C]
            s = smooth_scales(absmax[seen[0]], w_absmax, alpha)  # [C]
            fold_scales(block, g, s, lambda v: v)
            for n in absmax.keys() & set(g.linears):
                absmax[n] = absmax[n] / s

    return transform


def int8_quantize(model: Decoder, spec: Int8Spec, calib: torch.Tensor | None, done: BlockDone | None = None,
                  routed: RoutedTokens | None = None) -> dict[str, torch.Tensor]:
    """Int8OutlierLinear everywhere; ``calib`` may be None only for top-0 (no split) without smoothing."""
    if calib is None:
        def swap(block: nn.Module) -> None:
            swap_linears(block, lambda _, lin: Int8OutlierLinear.from_float(lin, outlier_dims(None, spec), spec.act_group))

        each_block(model, swap, "int8", done)
        return {}
    smooth = smooth_block(spec.smooth_alpha) if spec.smooth_alpha > 0 else None

    def make(_, lin: nn.Linear, absmax: torch.Tensor) -> Int8OutlierLinear:
        return Int8OutlierLinear.from_float(lin, outlier_dims(absmax, spec), spec.act_group)

    return calibrated_swap(model, calib, make, "int8 outliers", smooth, done, routed)

