"""Importance scores for structured pruning, from activations on calibration text (Minitron).

- MLP neuron i of layer l: mean |a_i| of the intermediate activation (the input of down_proj).
- Attention head h of layer l: mean over tokens of the L2 norm of the head's output (its slice of
  the input of o_proj).
- Embedding channel c: mean |x_c| of every hidden-wide RMSNorm output (the norms a family has in
  each block, ``cfg.arch.norms``: those before a sublayer and, in Gemma and OLMo 2, those on its
  output, which the residual stream adds; and the final one), summed over them. OLMo 2 has only
  the output norms (its sublayers read the raw stream); q/k norms are not on the hidden width.
- Layer l (depth): Block Importance, 1 - mean cos(x_in, x_out) of the block's residual stream; a
  block that barely turns its input matters least.

`magnitude` and `random` give the same shapes from weight norms or seeded noise: the ablations.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm

from compress.model.decoder import Decoder


@dataclass
class Importance:
    neurons: torch.Tensor  # [L, I]
    heads: torch.Tensor  # [L, H]
    channels: torch.Tensor  # [C]
    layers: torch.Tensor  # [L]


@torch.no_grad()
def activation_importance(model: Decoder, tokens: torch.Tensor, batch: int = 8) -> Importance:
    """tokens [N, T] of calibration text; one forward pass per batch with hooks that only accumulate."""
    cfg = model.cfg
    L, H, D = cfg.num_layers, cfg.num_heads, cfg.head_dim
    neurons, heads = torch.zeros(L, cfg.intermediate_size), torch.zeros(L, H)
    channels, layers = torch.zeros(cfg.hidden_size), torch.zeros(L)
    hooks = []

    def on_down(layer):
        def hook(module, args):
            neurons[layer] += args[0].abs().flatten(0, -2).sum(0).float()
        return hook

    def on_o(layer):
        def hook(module, args):
            x = args[0]  # [B, T, H * D]
            heads[layer] += x.unflatten(-1, (H, D)).norm(dim=-1).flatten(0, -2).sum(0).float()
        return hook

    def on_norm(module, args, out):
        channels.add_(out.abs().flatten(0, -2).sum(0).float())

    def on_block(layer):
        def hook(module, args, out):
            layers[layer] += (1 - F.cosine_similarity(args[0], out, dim=-1)).sum().float()
        return hook

    for i, block in enumerate(model.model.layers):
        hooks += [block.mlp.down_proj.register_forward_pre_hook(on_down(i)),
                  block.self_attn.o_proj.register_forward_pre_hook(on_o(i)),
                  block.register_forward_hook(on_block(i))]
        hooks += [getattr(block, name).register_forward_hook(on_norm) for name in cfg.arch.norms.names()]
    hooks.append(model.model.norm.register_forward_hook(on_norm))
    try:
        for chunk in tqdm(tokens.split(batch), desc="importance", unit="batch"):
            model(chunk)
    finally:
        for h in hooks:
            h.remove()
    n = tokens.numel()
    return Importance(neurons / n, heads / n, channels / n, layers / n)


def magnitude_importance(model: Decoder) -> Importance:
    """Weight norms: a neuron by its down_proj column, a head by its o_proj columns, a channel by its
    embedding column, a layer by the norm of all its Linear weights."""
    cfg = model.cfg
    blocks = model.model.layers
    neurons = torch.stack([b.mlp.down_proj.weight.detach().norm(dim=0) for b in blocks])
    heads = torch.stack([b.self_attn.o_proj.weight.detach().unflatten(1, (cfg.num_heads, cfg.head_dim)).norm(dim=(0, 2))
                         for b in blocks])
    channels = model.model.embed_tokens.weight.detach().norm(dim=0)
    layers = torch.stack([sum(m.weight.detach().norm() ** 2 for m in b.modules() if isinstance(m, torch.nn.Linear)).sqrt()
                          for b in blocks])
    return Importance(neurons.float(), heads.float(), channels.float(), layers.float())


def random_importance(model: Decoder, seed: int) -> Importance:
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    return Importance(torch.rand(cfg.num_layers, cfg.intermediate_size, generator=g),
                      torch.rand(cfg.num_layers, cfg.num_heads, generator=g),
                      torch.rand(cfg.hidden_size, generator=g), torch.rand(cfg.num_layers, generator=g))
