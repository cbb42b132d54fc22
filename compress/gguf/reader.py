"""A GGUF file as a checkpoint our engine runs, its decoder Linears kept as their codes, everything else dequantized.

llama.cpp's Q4_0 block is 32 weights w = d (q - 8), q in 0..15, with an fp16 d of either sign: exactly our int4
grid at group size 32 with the scale |d| and the zero point 8 (d > 0) or 7 (d < 0, the codes read as 15 - q:
gguf_blocks keeps every step positive), so a file whose decoder Linears are all Q4_0 becomes one of our int4
compressed-tensors checkpoints holding the same codes and scales, and our 4-bit kernels then compute with the
very numbers llama.cpp computes with. A file mixing the types gguf_blocks reads (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0)
becomes one of GgufLinear's: ggml's own codes, scales (and Q4_1/Q4_K's offsets) per Linear, unpacked to a byte a
weight on disk; the CPU runtime holds the 4-bit ones as nibbles and the wider ones as bytes (runtime/cpu_linears.py).
A file with any other Linear type (F16, F32, IQ*, Q2_K, ...) is dequantized to fp32 by transformers' reader. The
embedding, norms and output layer are dequantized in every case.
"""

from pathlib import Path

import numpy as np
import torch

from compress.errors import UserError
from compress.gguf.family import family, gguf_names, role, unpermute_rows
from compress.manifest import write_manifest
from compress.model import load
from compress.model.decoder import Decoder
from compress.quant import packing
from compress.quant.export import write_quantized
from compress.quant.gguf_blocks import TYPES, unpack
from compress.quant.linear import GgufLinear, GgufSpec, PackedLinear
from compress.quant.primitives import IntSpec

Q4_0 = IntSpec(4, 32)  # w = |d| (q - z), z in {7, 8}: Q4_0's block


def q4_0_linear(tensor, linear: torch.nn.Linear, heads: int | None) -> PackedLinear:
    """The PackedLinear of one Q4_0 GGUF tensor, rows in transformers' order (``heads``: q/k of a permuting family)."""
    raw = torch.from_numpy(np.asarray(tensor.data).copy()).reshape(linear.out_features, -1)  # [O, bytes]
    codes, grid = unpack(TYPES["Q4_0"], raw, linear.in_features)  # [O, I] uint8, a and b [O, G]: w = q a + b
    scale = grid.a
    zero = torch.where(scale > 0, -grid.b / scale.clamp(min=1e-30), 8.0).round().to(torch.int32)  # [O, G]: 7 or 8
    if heads is not None:
        codes, scale, zero = (unpermute_rows(t, heads) for t in (codes, scale, zero))
    new = PackedLinear(linear.in_features, linear.out_features, Q4_0, linear.bias is not None, torch.float32)
    new.weight_packed.copy_(packing.pack(codes, Q4_0.bits))
    new.weight_scale.copy_(scale)
    new.weight_zero_point.copy_(packing.pack_zero_points(zero, Q4_0.bits))
    if linear.bias is not None:
        new.bias.data.copy_(linear.bias.detach())
    return new


def linear_tensors(gguf_path: Path, model: Decoder) -> tuple[dict[tuple[int, str], tuple], str] | None:
    """({(layer, Linear name): (GGUF tensor, heads)}, the output layer's type) when every decoder Linear is of a type
    in TYPES, else None; heads: the q/k head count of a family whose converter permutes those rows."""
    from gguf import GGUFReader

    try:
        fam, name = family(model.cfg), gguf_names(model.cfg)
    except UserError:  # a family we do not write: read it dequantized
        return None
    tensors = {t.name: t for t in GGUFReader(str(gguf_path)).tensors}
    found = {}
    for i, block in enumerate(model.model.layers):
        for n in block.linears:
            gguf_name = name(f"model.layers.{i}.{n}.weight")
            tensor = tensors.get(gguf_name)
            if tensor is None or tensor.tensor_type.name not in TYPES:
                return None
            heads = {"attn_q": model.cfg.num_heads, "attn_k": model.cfg.num_kv_heads}.get(role(gguf_name)) if fam.permute_qk else None
            found[(i, n)] = (tensor, heads)
    output = tensors.get("output.weight", tensors["token_embd.weight"])  # the embedding where the file ties them
    return found, output.tensor_type.name


def gguf_linear(tensor, linear: torch.nn.Linear, heads: int | None) -> GgufLinear:
    """The GgufLinear of one GGUF tensor, rows in transformers' order."""
    raw = torch.from_numpy(np.asarray(tensor.data).copy()).reshape(linear.out_features, -1)  # [O, bytes]
    if heads is not None:
        raw = unpermute_rows(raw, heads)
    return GgufLinear.from_ggml(tensor.tensor_type.name, raw, linear.bias)


def swap(model: Decoder, linears: dict, make) -> None:
    for (i, n), (tensor, heads) in linears.items():
        parent, _, leaf = n.rpartition(".")
        setattr(model.model.layers[i].get_submodule(parent), leaf, make(tensor, model.model.layers[i].get_submodule(n), heads))


def convert(gguf_path: Path, out_dir: Path, keep_codes: bool = True) -> None:
    """The GGUF as an HF directory under ``out_dir``: int4 compressed-tensors with the file's codes where every decoder
    Linear is Q4_0, GgufLinear's codes where each is another type of TYPES, else (or not ``keep_codes``) fp32. The first
    two carry compress.json's "gguf" entry: the engine then computes as llama.cpp does by default (int8 activations; the
    lm_head as int8 rows where the file's is quantized)."""
    model = load.gguf_decoder(gguf_path)
    kept = linear_tensors(gguf_path, model) if keep_codes else None
    if kept is None:
        load.save_decoder(model, out_dir)
        load.save_gguf_tokenizer(gguf_path, out_dir)
        return
    linears, output = kept
    kinds = sorted({tensor.tensor_type.name for tensor, _ in linears.values()})
    if kinds == ["Q4_0"]:
        swap(model, linears, q4_0_linear)
        write_quantized(model, Q4_0, out_dir, None, dtype=torch.float32)
    else:
        swap(model, linears, gguf_linear)
        types = {f"model.layers.{i}.{n}": tensor.tensor_type.name for (i, n), (tensor, _) in linears.items()}
        write_quantized(model, GgufSpec(types), out_dir, None, dtype=torch.float32)
    load.save_gguf_tokenizer(gguf_path, out_dir)
    write_manifest(out_dir, gguf={"file": gguf_path.name, "linears": ",".join(kinds), "output": output})
