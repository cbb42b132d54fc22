"""A Decoder whose weights stay in the checkpoint until a part of it is needed.

``skeleton`` builds the modules on the meta device (no memory); ``materialize`` reads one part
(a block, the embeddings, ...) tensor by tensor from the model's ``Checkpoint`` and ``release``
gives it back, so a pass over the blocks holds one block at a time (accelerate's
``init_empty_weights`` + sequential onloading, in a few functions).

The model carries ``model.reader(name, module) -> {tensor name: tensor}``: how one leaf module's
own tensors are read (checkpoint formats whose names differ, like AutoAWQ's, bring their own).
"""

from collections.abc import Callable

import torch
from torch import nn

from compress.model.checkpoint import FP8, Checkpoint
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder

Reader = Callable[[str, nn.Module], dict[str, torch.Tensor]]
# Tensors that keep their stored dtype whatever the model's dtype: codes, indices, and int8's fp16 outlier columns.
KEEP_DTYPE = (".weight_packed", ".weight_zero_point", ".weight_shape", ".outlier_idx", ".outlier_weight")


def keeps_dtype(name: str, dtype: torch.dtype) -> bool:
    """Whether the tensor ``name`` stored as ``dtype`` keeps that dtype when the model's changes."""
    return not dtype.is_floating_point or dtype == FP8 or ("." + name).endswith(KEEP_DTYPE)


def cast(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Floating tensors to ``dtype`` (None: as stored), except those that keep theirs (``KEEP_DTYPE``)."""
    if dtype is None:
        return tensors
    return {k: v if keeps_dtype(k, v.dtype) else v.to(dtype) for k, v in tensors.items()}


def skeleton(cfg: ModelConfig) -> Decoder:
    with torch.device("meta"):
        model = Decoder(cfg)
    return model


def own_tensors(module: nn.Module) -> list[str]:
    """Names of the tensors a module holds itself (not its children's): what a checkpoint stores for it."""
    return [n for n, _ in module.named_parameters(recurse=False)] + [
        n for n, b in module.named_buffers(recurse=False) if n not in module._non_persistent_buffers_set]


def plain_reader(ckpt: Checkpoint) -> Reader:
    return lambda name, module: {n: ckpt.get(f"{name}.{n}") for n in own_tensors(module)}


def attach(model: Decoder, ckpt: Checkpoint, reader: Reader | None = None) -> Decoder:
    model.checkpoint, model.reader = ckpt, reader or plain_reader(ckpt)
    return model


def is_lazy(module: nn.Module) -> bool:
    return any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers())


def materialize(model: Decoder, name: str, dtype: torch.dtype | None, device: torch.device | str = "cpu") -> nn.Module:
    """Read the part ``name`` of ``model`` (e.g. "model.layers.3") from its checkpoint, leaf by leaf, as ``dtype``."""
    part = model.get_submodule(name)
    for sub, leaf in part.named_modules():
        if not own_tensors(leaf):
            continue
        full = f"{name}.{sub}" if sub else name
        tensors = cast(model.reader(full, leaf), dtype)
        leaf.load_state_dict({k: v.to(device) for k, v in tensors.items()}, strict=True, assign=True)
    if model.cfg.tie_word_embeddings and name in ("model", "model.embed_tokens", ""):
        model.lm_head.weight = model.model.embed_tokens.weight
    return part


def release(model: Decoder, name: str) -> None:
    """Drop the materialized part ``name``'s tensors (it can be materialized again)."""
    model.get_submodule(name).to_empty(device="meta")
    if model.cfg.tie_word_embeddings and name == "model.embed_tokens":
        model.lm_head.weight = model.model.embed_tokens.weight  # else lm_head would keep the released table alive


def top_parts(model: Decoder) -> list[str]:
    """The parts a whole model is read in, one block at a time; a tied lm_head is the embeddings."""
    parts = ["model.embed_tokens", *(f"model.layers.{i}" for i in range(model.cfg.num_layers)), "model.norm"]
    return parts if model.cfg.tie_word_embeddings else [*parts, "lm_head"]


def part_dtype(model: Decoder, name: str, dtype: torch.dtype) -> torch.dtype | None:
    """The dtype the whole-model load gives part ``name`` (None: as stored). An untied embedding table
    stored narrower than ``dtype`` stays as stored: only the rows of the tokens are read from it, and
    widening those is exact (Llama-3-8B's bf16 table: 1 GB instead of 2)."""
    if name != "model.embed_tokens" or model.cfg.tie_word_embeddings:
        return dtype
    stored = model.checkpoint.stored_dtype("model.embed_tokens.weight")
    return None if stored.is_floating_point and stored.itemsize < dtype.itemsize else dtype


def materialize_all(model: Decoder, dtype: torch.dtype, device: torch.device | str = "cpu", stored: tuple[str, ...] = ()) -> Decoder:
    """The whole model in memory (``part_dtype``; the parts named in ``stored`` as stored: an lm_head the runtime
    turns into int8 rows is never widened whole): it never holds more than itself plus one tensor being read."""
    for name in top_parts(model):
        if is_lazy(model.get_submodule(name)):
            materialize(model, name, None if name in stored else part_dtype(model, name, dtype), device)
    return model.eval()
