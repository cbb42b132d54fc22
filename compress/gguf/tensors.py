"""A GGUF file's tensors by our decoder's (Hugging Face) names, each read from the file's memory map when asked:
the inverse of what export.py stores (q/k rows back from llama.cpp's rotary order, Gemma's norms from 1 + w back
to w), as ggml's bytes for a Linear kept as codes, else dequantized to fp32. Only the families we write
(family.py) are read this way; transformers' GGUF reader (metadata.gguf_decoder) reads the rest.
"""

import math
from pathlib import Path

import numpy as np
import torch

from compress.gguf.family import family, gguf_names, role, unpermute_rows
from compress.model.config import ModelConfig
from compress.model.lazy import own_tensors
from compress.quant.gguf_blocks import TYPES, dequantize

ROWS = 4096  # rows dequantized at a time


class GgufTensors:
    def __init__(self, path: Path, cfg: ModelConfig):
        from gguf import GGUFReader

        self.cfg, self.fam, self.gguf_name = cfg, family(cfg), gguf_names(cfg)  # family(): a UserError if not ours
        self.path = Path(path)
        self.tensors = {t.name: t for t in GGUFReader(str(path)).tensors}

    def rows(self, entry, start: int = 0, count: int | None = None) -> torch.Tensor:
        """uint8 [count, bytes]: rows start.. of a quantized tensor, read from the file (not through the reader's
        memory map, whose pages would stay resident and count against the process: 4.7 GiB of an 8B file)."""
        row_bytes = entry.data.shape[-1]  # the map's shape: no page of it is read
        data_rows = int(entry.n_bytes) // row_bytes
        count = data_rows - start if count is None else min(count, data_rows - start)
        with open(self.path, "rb") as f:
            f.seek(entry.data_offset + start * row_bytes)
            return torch.from_numpy(np.fromfile(f, np.uint8, count * row_bytes)).reshape(count, row_bytes)

    def entry(self, name: str):
        """The GGUF tensor of the HF tensor ``name`` (a tied lm_head is the embedding's)."""
        if name == "lm_head.weight" and "output.weight" not in self.tensors:
            name = "model.embed_tokens.weight"
        return self.tensors[self.gguf_name(name)]

    def kind(self, name: str) -> str:
        return self.entry(name).tensor_type.name

    def heads(self, name: str) -> int | None:
        """The head count whose rotary rows llama.cpp's converter permuted in this tensor, else None."""
        r = role(self.entry(name).name)  # a tied lm_head's entry is the embedding's
        return {"attn_q": self.cfg.num_heads, "attn_k": self.cfg.num_kv_heads}.get(r) if self.fam.permute_qk else None

    def raw(self, name: str, out_features: int) -> torch.Tensor:
        """uint8 [O, bytes]: a quantized Linear's ggml rows, in transformers' row order."""
        rows = self.rows(self.entry(name)).reshape(out_features, -1)
        heads = self.heads(name)
        return rows if heads is None else unpermute_rows(rows, heads)

    def get(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        """fp32 ``shape``: the HF tensor ``name`` as transformers holds it."""
        import gguf

        entry = self.entry(name)
        kind = entry.tensor_type.name
        if kind in TYPES:  # rows a chunk at a time: a 152k-row table's temporaries would be several times its size
            x = torch.empty(math.prod(shape[:-1]), shape[-1])
            for r in range(0, x.shape[0], ROWS):
                x[r : r + ROWS] = dequantize(TYPES[kind], self.rows(entry, r, ROWS), shape[-1])
        else:
            x = torch.from_numpy(np.array(gguf.quants.dequantize(entry.data, entry.tensor_type)))  # a copy: the map is read-only
        x = x.float().reshape(shape)
        heads = self.heads(name)
        if heads is not None:
            x = unpermute_rows(x, heads)
        if self.fam.norm_plus_one and role(entry.name).endswith("norm"):
            x = x - 1
        return x

    def reader(self, part: str, module: torch.nn.Module) -> dict[str, torch.Tensor]:
        """lazy.Reader: the tensors ``module`` (the part ``part`` of the decoder) holds itself."""
        return {n: self.get(f"{part}.{n}", tuple(getattr(module, n).shape)) for n in own_tensors(module)}
