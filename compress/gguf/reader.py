"""A GGUF file as a checkpoint our engine runs, its decoder Linears kept as their codes, everything else dequantized.

llama.cpp's Q4_0 block is 32 weights w = d (q - 8), q in 0..15, with an fp16 d of either sign: exactly our int4
grid at group size 32 with the scale |d| and the zero point 8 (d > 0) or 7 (d < 0, the codes read as 15 - q:
gguf_blocks keeps every step positive), so a file whose decoder Linears are all Q4_0 becomes one of our int4
compressed-tensors checkpoints holding the same codes and scales, and our 4-bit kernels then compute with the
very numbers llama.cpp computes with. A file mixing the types gguf_blocks reads (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0)
becomes one of GgufLinear's: ggml's own codes, scales (and Q4_1/Q4_K's offsets) per Linear, unpacked to a byte a
weight on disk, and so does an output layer of those types (a tied one of under a byte a weight, Q6_K or 4/5-bit, written
as its own tensor beside the embedding's table, so that the output layer computes with the file's codes as llama.cpp's
does; a tied Q8_0 one stays tied, the runtime making int8 rows of the table; an all-Q4_0 file with a kept output layer
then takes this form too); the CPU runtime holds them in the file's own bits (runtime/cpu_linears.py).
A file with any other Linear type (F16, F32, IQ*, Q2_K, ...) is dequantized to fp32 by transformers' reader. The
embedding and norms are dequantized in every case, the output layer where its type is not one of those.

Where the codes are kept and the family is one we write (family.py), the file is read block by block from its
memory map (tensors.py) and written as each block is read, so an 8B file is never held whole; transformers'
reader (which dequantizes the whole model at once) reads the others.
"""

import dataclasses
from pathlib import Path

import torch

from tqdm import tqdm

from compress.errors import UserError
from compress.gguf import metadata
from compress.gguf.tensors import GgufTensors
from compress.manifest import write_manifest
from compress.model import lazy, load
from compress.model.decoder import Decoder
from compress.quant import packing
from compress.quant.export import QuantizedWriter
from compress.quant.gguf_blocks import TYPES, unpack
from compress.quant.linear import GgufLinear, GgufSpec, PackedLinear
from compress.quant.primitives import IntSpec

Q4_0 = IntSpec(4, 32)  # w = |d| (q - z), z in {7, 8}: Q4_0's block


def q4_0_linear(src: GgufTensors, name: str, linear: torch.nn.Linear) -> PackedLinear:
    """The PackedLinear of the Q4_0 tensor of the HF Linear ``name``."""
    codes, grid = unpack(TYPES["Q4_0"], src.raw(f"{name}.weight", linear.out_features), linear.in_features)
    scale = grid.a  # [O, G]: w = q a + b
    zero = torch.where(scale > 0, -grid.b / scale.clamp(min=1e-30), 8.0).round().to(torch.int32)  # [O, G]: 7 or 8
    new = PackedLinear(linear.in_features, linear.out_features, Q4_0, linear.bias is not None, torch.float32)
    new.weight_packed.copy_(packing.pack(codes, Q4_0.bits))
    new.weight_scale.copy_(scale)
    new.weight_zero_point.copy_(packing.pack_zero_points(zero, Q4_0.bits))
    if linear.bias is not None:
        new.bias.data.copy_(linear.bias.detach())
    return new


def gguf_linear(src: GgufTensors, name: str, linear: torch.nn.Linear) -> GgufLinear:
    """The GgufLinear of the tensor of the HF Linear ``name``: ggml's codes of its type."""
    return GgufLinear.from_ggml(src.kind(f"{name}.weight"), src.raw(f"{name}.weight", linear.out_features), linear.bias)


def linear_types(src: GgufTensors, model: Decoder) -> dict[str, str] | None:
    """{HF Linear name: GGUF type} when every decoder Linear's type is one of TYPES, else None."""
    found = {}
    for i, block in enumerate(model.model.layers):
        for n in block.linears:
            name = f"model.layers.{i}.{n}"
            try:
                found[name] = src.kind(f"{name}.weight")
            except KeyError:
                return None
            if found[name] not in TYPES:
                return None
    return found


def read_block(src: GgufTensors, model: Decoder, i: int, make) -> torch.nn.Module:
    """Block i of ``model`` (a skeleton) read from the file: its Linears by ``make``, its other tensors fp32."""
    prefix = f"model.layers.{i}"
    block = model.get_submodule(prefix).to_empty(device="cpu")
    weights = {f"{n}.weight" for n in block.linears}
    with torch.no_grad():
        for sub, leaf in block.named_modules():
            for n in lazy.own_tensors(leaf):
                local = f"{sub}.{n}" if sub else n
                if local not in weights:
                    getattr(leaf, n).copy_(src.get(f"{prefix}.{local}", tuple(getattr(leaf, n).shape)))
    for n in block.linears:
        parent, _, leaf = n.rpartition(".")
        setattr(block.get_submodule(parent), leaf, make(src, f"{prefix}.{n}", block.get_submodule(n)))
    return block


def stream_codes(gguf_path: Path, out_dir: Path) -> dict | None:
    """Write the file as our checkpoint keeping its Linears' codes, block by block (compress.json's "gguf" entry
    returned); None where this path does not apply (a family we do not write, a Linear of another type)."""
    cfg = metadata.gguf_config(gguf_path)
    try:
        src = GgufTensors(gguf_path, cfg)
    except UserError:  # a family we do not write: read it dequantized
        return None
    types = linear_types(src, lazy.skeleton(cfg))
    if types is None:
        return None
    kinds = sorted(set(types.values()))
    out = TYPES.get(src.kind("lm_head.weight"))
    # the output layer keeps its codes too; a tied one becomes its own tensor (the embedding stays a table) only where
    # the runtime computes with those codes (under a byte a weight: cpu_linears.codes_are_smaller), else stays tied
    head = out is not None and (out.under_a_byte or not cfg.tie_word_embeddings)
    if head:
        types["lm_head"] = out.name
        cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
    model = lazy.attach(lazy.skeleton(cfg), None, src.reader)
    spec, make = (Q4_0, q4_0_linear) if kinds == ["Q4_0"] and not head else (GgufSpec(types), gguf_linear)
    writer = QuantizedWriter(out_dir, model, spec, "compressed-tensors", torch.float32, None)
    for i in tqdm(range(model.cfg.num_layers), desc=f"reading {Path(gguf_path).name}", unit="block"):
        writer.block(i, read_block(src, model, i, make))
        model.model.layers[i].to_empty(device="meta")  # the block's memory goes; the skeleton stays
    if head:  # read last: held through the blocks, an 8B's would add 0.8 GB to the whole read
        model.lm_head = gguf_linear(src, "lm_head", model.lm_head)
    writer.finish()
    return {"file": Path(gguf_path).name, "linears": ",".join(kinds), "output": src.kind("lm_head.weight")}


def convert(gguf_path: Path, out_dir: Path, keep_codes: bool = True) -> None:
    """The GGUF as an HF directory under ``out_dir``: int4 compressed-tensors with the file's codes where every decoder
    Linear is Q4_0, GgufLinear's codes where each is another type of TYPES, else (or not ``keep_codes``) fp32. The first
    two carry compress.json's "gguf" entry: the engine then computes as llama.cpp does by default (int8 activations; the
    lm_head as int8 rows where the file's is quantized)."""
    kept = stream_codes(gguf_path, out_dir) if keep_codes else None
    if kept is None:
        load.save_decoder(metadata.gguf_decoder(gguf_path), out_dir)
    metadata.save_gguf_tokenizer(gguf_path, out_dir)
    if kept is not None:
        write_manifest(out_dir, gguf=kept)
