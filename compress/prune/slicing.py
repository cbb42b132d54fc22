"""Which rows and columns survive (from importance scores), and the sliced model.

GQA rule: query head h belongs to KV group h // (H / KV). Pruning keeps the same number of query
heads in every kept group, so the pruned model is again a uniform GQA model: a group scores the
sum of its best H'/KV' heads, the best KV' groups stay, and in each the best H'/KV' heads stay,
in their original order (so head i of the pruned model still reads KV group i // (H'/KV')).

Every family is sliced by the same table: a parameter's name says what indexes each of its dims.
Fused projections (Phi-3) are their parts' row blocks, sliced alike: qkv_proj's q rows, then k,
then v; gate_up_proj's gate rows, then up rows. q/k norms over a head's D stay whole (D is never
pruned); over the whole projection (OLMo 2) they are sliced like q and k. Gemma scales embeddings
by sqrt(hidden_size), which a narrower model changes: the table takes the difference.
"""

from dataclasses import asdict, dataclass

import torch

from compress.errors import UserError
from compress.model.arch import Arch
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.model.load import build, load_weights, state_for_saving
from compress.prune.importance import Importance
from compress.prune.shape import Shape

# parameter name (after "model.layers.N.") -> what indexes each of its dims; None keeps a dim whole.
# A name the family lacks is skipped; its norms and q/k norms are added by layer_slices.
LINEAR_SLICES = {
    "self_attn.q_proj.weight": ("q_rows", "channels"),
    "self_attn.q_proj.bias": ("q_rows",),
    "self_attn.k_proj.weight": ("kv_rows", "channels"),
    "self_attn.k_proj.bias": ("kv_rows",),
    "self_attn.v_proj.weight": ("kv_rows", "channels"),
    "self_attn.v_proj.bias": ("kv_rows",),
    "self_attn.qkv_proj.weight": ("qkv_rows", "channels"),
    "self_attn.qkv_proj.bias": ("qkv_rows",),
    "self_attn.o_proj.weight": ("channels", "q_rows"),
    "self_attn.o_proj.bias": ("channels",),
    "mlp.gate_proj.weight": ("neurons", "channels"),
    "mlp.up_proj.weight": ("neurons", "channels"),
    "mlp.gate_up_proj.weight": ("gate_up_rows", "channels"),
    "mlp.down_proj.weight": ("channels", "neurons"),
}
QK_NORM_SLICES = {
    None: {},
    "head": {"self_attn.q_norm.weight": (None,), "self_attn.k_norm.weight": (None,)},
    "proj": {"self_attn.q_norm.weight": ("q_rows",), "self_attn.k_norm.weight": ("kv_rows",)},
}
GLOBAL_SLICES = {
    "model.embed_tokens.weight": (None, "channels"),
    "model.norm.weight": ("channels",),
    "lm_head.weight": (None, "channels"),
}


def layer_slices(arch: Arch) -> dict[str, tuple]:
    return {**{f"{n}.weight": ("channels",) for n in arch.norms.names()}, **QK_NORM_SLICES[arch.qk_norm], **LINEAR_SLICES}


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


def layer_index(cfg: ModelConfig, keep: Keep, i: int) -> dict[str, list[int]]:
    """The kept indices of kept layer i by what they index (layer_slices' names)."""
    Q, KV, M = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    q, kv, neurons = rows(keep.heads[i], cfg.head_dim), rows(keep.kv_heads[i], cfg.head_dim), keep.neurons[i]
    return {"channels": keep.channels, "neurons": neurons, "q_rows": q, "kv_rows": kv,
            "qkv_rows": q + [Q + r for r in kv] + [Q + KV + r for r in kv], "gate_up_rows": neurons + [M + n for n in neurons]}


def rule_name(name: str) -> str:
    """A parameter's name in the slicing tables: without "model.layers.N." inside a layer."""
    return name.split(".", 3)[3] if name.startswith("model.layers.") else name


def sliced_state(cfg: ModelConfig, state: dict[str, torch.Tensor], keep: Keep) -> dict[str, torch.Tensor]:
    """The kept slices of state, renamed to the kept layers' new numbers; a tensor no rule covers is refused."""
    new = {name: slice_tensor(state[name], dims, {"channels": keep.channels})
           for name, dims in GLOBAL_SLICES.items() if name in state}
    slices = layer_slices(cfg.arch)
    for i, layer in enumerate(keep.layers):
        index = layer_index(cfg, keep, i)
        for name, dims in slices.items():
            old = f"model.layers.{layer}.{name}"
            if old in state:
                new[f"model.layers.{i}.{name}"] = slice_tensor(state[old], dims, index)
    unknown = [k for k in state if rule_name(k) not in slices.keys() | GLOBAL_SLICES.keys()]
    if unknown:
        raise UserError(f"cannot prune this {cfg.model_type} model: no slicing rule for {unknown[0]}")
    return new


def rescale_embedding(state: dict[str, torch.Tensor], factor: float, cfg: ModelConfig) -> None:
    """Embeddings scaled by the width (Gemma's sqrt(hidden_size)) keep their values in a narrower model: the table
    is multiplied by factor (old scale / new scale); a tied lm_head reads the same table, so the final norm's scale
    (offset + w) is divided by it, which leaves the logits as they were."""
    if factor == 1.0:
        return
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] * factor
    if cfg.tie_word_embeddings:
        offset = cfg.arch.norm_offset
        state["model.norm.weight"] = (offset + state["model.norm.weight"]) / factor - offset


def prune(model: Decoder, keep: Keep, shape: Shape) -> Decoder:
    """A new Decoder of the pruned shape holding the kept slices of model's weights."""
    cfg = model.cfg
    new = sliced_state(cfg, state_for_saving(model), keep)
    student = build(shape.apply(cfg, keep.layers), next(model.parameters()).dtype)
    rescale_embedding(new, model.embed_scale / student.embed_scale, cfg)
    return load_weights(student, new).eval()
