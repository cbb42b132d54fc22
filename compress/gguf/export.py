"""Write a Decoder as a GGUF file of one llama.cpp file type, block by block (``block``), as a quantization runs.

The methods round each block's Linears through ``round_block`` (AWQ: after its scales are folded, with the
block's group Hessians and E[x x^T]; RTN and Q8_0: weight only) and go on computing with the rounded weights;
``block`` then writes that block's tensors, ``finish`` the final norm and an untied output layer. The token
embedding is rounded and written when the file is opened (weight only, ROWS rows at a time).
"""

import json
from collections.abc import Callable
from pathlib import Path

import torch

from compress.gguf import rounding
from compress.gguf.family import family, gguf_names, hyperparameters, permute_rows, role, rope_freqs
from compress.gguf.types import FileType, tensor_type
from compress.gguf.vocab import add_vocab
from compress.gguf.writer import GgufFile, Planned
from compress.model import lazy
from compress.model.decoder import Decoder

QUANTIZATION_VERSION = 2  # general.quantization_version of llama.cpp's current block layouts


class GgufExport:
    def __init__(self, path: Path, model: Decoder, ft: FileType, source_dir: Path, recipe: dict):
        self.model, self.ft, self.cfg, self.fam = model, ft, model.cfg, family(model.cfg)
        self.name = gguf_names(model.cfg)
        self.kinds: dict[str, str] = {}  # GGUF name -> type, for every planned tensor
        plan = self.plan()
        self.file = GgufFile(path, self.fam.arch, plan, lambda w: self.metadata(w, source_dir, recipe))
        self.rounded: dict[str, torch.Tensor] = {}  # the current block's Linears, as the type's bytes
        self.stats = {"bytes": sum(p.nbytes for p in plan), "types": self.type_counts(plan)}
        self.write_embedding()

    # -- what the file holds ------------------------------------------------------------------------------
    def planned(self, hf_name: str, shape: tuple[int, ...], layer: int = 0) -> Planned:
        name = self.name(hf_name)
        kind = "F32" if len(shape) == 1 else tensor_type(self.ft, role(name), shape[1], layer, self.cfg.num_layers,
                                                          self.cfg.tie_word_embeddings)
        self.kinds[name] = kind
        return Planned(name, tuple(shape), kind)

    def plan(self) -> list[Planned]:
        m, out = self.model, []
        out.append(self.planned("model.embed_tokens.weight", tuple(m.model.embed_tokens.weight.shape)))
        freqs = rope_freqs(self.cfg)
        if freqs is not None:
            out.append(Planned("rope_freqs.weight", tuple(freqs.shape), "F32"))
        for i, block in enumerate(m.model.layers):
            out += [self.planned(f"model.layers.{i}.{k}", tuple(v.shape), i) for k, v in block.state_dict().items()]
        out.append(self.planned("model.norm.weight", tuple(m.model.norm.weight.shape)))
        if not self.cfg.tie_word_embeddings:
            out.append(self.planned("lm_head.weight", tuple(m.lm_head.weight.shape)))
        return out

    @staticmethod
    def type_counts(plan: list[Planned]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in plan:
            counts[p.kind] = counts.get(p.kind, 0) + 1
        return counts

    def metadata(self, writer, source_dir: Path, recipe: dict) -> None:
        arch = self.fam.arch
        writer.add_name(Path(source_dir).name)
        writer.add_file_type(self.ft.ftype)
        writer.add_quantization_version(QUANTIZATION_VERSION)
        writer.add_string("general.quantized_by", "compress")
        writer.add_string("compress.recipe", json.dumps(recipe, sort_keys=True))  # a GGUF has no compress.json
        for key, value in hyperparameters(self.cfg).items():
            add = writer.add_string if isinstance(value, str) else writer.add_float32 if isinstance(value, float) else writer.add_uint32
            add(f"{arch}.{key}", value)
        add_vocab(writer, Path(source_dir), self.cfg.vocab_size)

    # -- writing ------------------------------------------------------------------------------------------
    def stored(self, name: str, gguf_name: str, data: torch.Tensor) -> torch.Tensor:
        """Rows of q and k (weights and biases) in llama.cpp's rotary order where the family needs it; a norm's
        1 + w where the family's norms scale by that."""
        if self.fam.norm_plus_one and role(gguf_name).endswith("norm"):
            return data.float() + 1
        if not self.fam.permute_qk or role(gguf_name) not in ("attn_q", "attn_k"):
            return data
        return permute_rows(data, self.cfg.num_heads if role(gguf_name) == "attn_q" else self.cfg.num_kv_heads)

    def write_part(self, part: str) -> None:
        """A part outside the blocks (embedding, final norm, lm_head), read as stored and rounded weight only."""
        module = self.model.get_submodule(part)
        tensors = self.model.reader(part, module) if lazy.is_lazy(module) else module.state_dict()
        for k, v in tensors.items():
            name = self.name(f"{part}.{k}")
            kind = self.kinds[name]
            self.file.write(name, rounding.weight_only(kind, self.stored(k, name, v), False, f"{name} {kind}")[0])

    def write_embedding(self) -> None:
        self.write_part("model.embed_tokens")
        freqs = rope_freqs(self.cfg)
        if freqs is not None:
            self.file.write("rope_freqs.weight", freqs)

    def round_block(self, i: int, block: torch.nn.Module, hessians: dict | None = None, grams: dict | None = None,
                    grid: int = 20, tune: rounding.Tune | None = None) -> None:
        """Round block ``i``'s Linears into their types (rounding.round_linears) and keep their bytes for ``block``."""
        names = {n: self.name(f"model.layers.{i}.{n}.weight") for n in block.linears}
        raw = rounding.round_linears(block, {n: self.kinds[g] for n, g in names.items()}, hessians, grams, grid, tune)
        self.rounded |= {names[n]: r for n, r in raw.items()}

    def block(self, i: int, block: torch.nn.Module) -> None:
        for k, v in block.state_dict().items():
            name = self.name(f"model.layers.{i}.{k}")
            data = self.rounded.pop(name) if name in self.rounded else v.float()
            self.file.write(name, self.stored(k, name, data))

    def finish(self) -> None:
        self.write_part("model.norm")
        if not self.cfg.tie_word_embeddings:
            self.write_part("lm_head")
        self.file.close()


def rounder(export: GgufExport, grid: int) -> Callable:
    """AWQ's per-block finish (awq_apply.awq_block's ``finish``) for layer i: round into the file's types."""
    return lambda i: lambda block, hessians, grams, tune: export.round_block(i, block, hessians, grams, grid, tune)
