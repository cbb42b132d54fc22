"""Which rows and columns survive (from importance scores), and the sliced model.

GQA rule: query head h belongs to KV group h // (H / KV). Pruning keeps the same number of query
heads in every kept group, so the pruned model is again a uniform GQA model: a group scores the
sum of its best H'/KV' heads, the best KV' groups stay, and in each the best H'/KV' heads stay,
in their original order (so head i of the pruned model still reads KV group i // (H'/KV')).
"""

from dataclasses import asdict, dataclass

import torch

from compress.model.decoder import Decoder
from compress.model.load import build, load_weights, state_for_saving
from compress.prune.importance import Importance
from compress.prune.shape import Shape

# parameter name (after "model.layers.N.") -> what indexes each of its dims; None keeps a dim whole
LAYER_SLICES = {
    "input_layernorm.weight": ("channels",),
    "post_attention_layernorm.weight": ("channels",),
    "self_attn.q_proj.weight": ("q_rows", "channels"),
    "self_attn.q_proj.bias": ("q_rows",),
    "self_attn.k_proj.weight": ("kv_rows", "channels"),
    "self_attn.k_proj.bias": ("kv_rows",),
    "self_attn.v_proj.weight": ("kv_rows", "channels"),
    "self_attn.v_proj.bias": ("kv_rows",),
    "self_attn.o_proj.weight": ("channels", "q_rows"),
    "mlp.gate_proj.weight": ("neurons", "channels"),
    "mlp.up_proj.weight": ("neurons", "channels"),
    "mlp.down_proj.weight": ("channels", "neurons"),
}
GLOBAL_SLICES = {
    "model.embed_tokens.weight": (None, "channels"),
    "model.norm.weight": ("channels",),
    "lm_head.weight": (None, "channels"),
}


@dataclass
class Keep:
    """Kept indices of the original model, in order: what compress.json records."""

    layers: list[int]
    channels: list[int]
    neurons: list[list[int]]  # per kept layer
    heads: list[list[int]]  # query heads, per kept layer
    kv_heads: list[list[int]]  # per kept layer

    def to_json(self) -> dict:
        return asdict(self)


def top(scores: torch.Tensor, k: int) -> list[int]:
    return sorted(scores.topk(k).indices.tolist())


def select(imp: Importance, full: Shape, shape: Shape) -> Keep:
    layers = top(imp.layers, shape.num_layers)
    per_group, keep_per_group = full.num_heads // full.num_kv_heads, shape.num_heads // shape.num_kv_heads
    heads, kv_heads = [], []
    for layer in layers:
        by_group = imp.heads[layer].view(full.num_kv_heads, per_group)  # [KV, H/KV]
        group_score = by_group.topk(keep_per_group, dim=1).values.sum(1)
        groups = top(group_score, shape.num_kv_heads)
        kv_heads.append(groups)
        heads.append([g * per_group + h for g in groups for h in top(by_group[g], keep_per_group)])
    return Keep(layers, top(imp.channels, shape.hidden_size),
                [top(imp.neurons[layer], shape.intermediate_size) for layer in layers], heads, kv_heads)


def rows(heads: list[int], head_dim: int) -> list[int]:
    return [h * head_dim + d for h in heads for d in range(head_dim)]


def slice_tensor(t: torch.Tensor, dims: tuple, index: dict[str, list[int]]) -> torch.Tensor:
    for dim, name in enumerate(dims):
        if name is not None:
            t = t.index_select(dim, torch.tensor(index[name]))
    return t.contiguous()


def prune(model: Decoder, keep: Keep, shape: Shape) -> Decoder:
    """A new Decoder of the pruned shape holding the kept slices of model's weights."""
    cfg, state = model.cfg, state_for_saving(model)
    new = {}
    for name, dims in GLOBAL_SLICES.items():
        if name in state:
            new[name] = slice_tensor(state[name], dims, {"channels": keep.channels})
    for i, layer in enumerate(keep.layers):
        index = {"channels": keep.channels, "neurons": keep.neurons[i],
                 "q_rows": rows(keep.heads[i], cfg.head_dim), "kv_rows": rows(keep.kv_heads[i], cfg.head_dim)}
        for name, dims in LAYER_SLICES.items():
            old = f"model.layers.{layer}.{name}"
            if old in state:
                new[f"model.layers.{i}.{name}"] = slice_tensor(state[old], dims, index)
    dtype = next(model.parameters()).dtype
    return load_weights(build(shape.apply(cfg), dtype), new).eval()
