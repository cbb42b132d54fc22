"""The model a GGUF file describes: its architecture, its config (transformers' mapping of the metadata keys plus what
that mapping drops), and transformers' whole-model reading for the files our block-by-block reader does not take.

transformers' GGUF config mapping ignores Gemma 2's soft-cap keys, qwen3's key_length (head_dim) and every
"{arch}.rope.scaling.*" key, and leaves Gemma's query_pre_attn_scalar at its default 256 (llama.cpp computes the
attention scale from the shape instead: family.query_scalar): a Gemma 2 with other caps or head_dim, a Qwen3 whose
head_dim is not 128, or a Gemma 3 4B file (linear scaling 8 on its global layers), read through that mapping alone
computes other logits. ``gguf_config`` puts them back; scalings it does not read are refused.
"""

import copy
from pathlib import Path

import torch

from compress.errors import UserError
from compress.gguf.family import FAMILIES, query_scalar
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights

# GGUF names of our families that transformers' GGUF reader loads (Mistral and SmolLM2 files say "llama"; "gemma3" is
# Gemma 3's text decoder).
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
READ_ROPE_TYPES = ("linear", "yarn")  # "{arch}.rope.scaling.type" values read, for the families we write
ROPE_SCALING_KEYS = ("type", "factor", "original_context_length", "finetuned")  # the "{arch}.rope.scaling.*" keys read

# Rotary scaling nothing here reads: tensors (Llama 3.1's rope_freqs, Phi-3's longrope factors), other types or
# parameters (yarn's attn_factor...); a model converted without them computes other logits.
DROPPED_GGUF_TENSORS = ("rope_freqs.", "rope_factors_")


def dropped_rope(reader) -> list[str]:
    """The file's rotary-scaling tensors and keys that a conversion would drop (phi3 files go through transformers'
    mapping, which reads no scaling keys)."""
    ours = reader.fields["general.architecture"].contents() in {f.arch for f in FAMILIES.values()}
    dropped = {t.name for t in reader.tensors if t.name.startswith(DROPPED_GGUF_TENSORS)}
    for k, f in reader.fields.items():
        name = k.rpartition(".rope.scaling.")[2] if ".rope.scaling." in k else None
        if name == "type" and f.contents() not in ("none", "") and not (ours and f.contents() in READ_ROPE_TYPES):
            dropped.add(k)
        elif name is not None and name not in ROPE_SCALING_KEYS:
            dropped.add(k)
    return sorted(dropped)


def open_reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise UserError(f"{path} is not a readable GGUF file ({e})") from e


def supported_gguf(gguf_path: Path, reader=None) -> str:
    """The GGUF's general.architecture, one of GGUF_ARCHS (else one line); refused where a conversion would drop its
    rotary scaling. ``reader``: the file's GGUFReader where the caller has one open."""
    reader = open_reader(gguf_path) if reader is None else reader
    if "general.architecture" not in reader.fields:
        raise UserError(f"{gguf_path} is not a readable GGUF file (no general.architecture key)")
    dropped = dropped_rope(reader)
    if dropped:
        raise UserError(f"{gguf_path} scales its rotary embedding ({', '.join(dropped)}) in a way that this reader does "
                        "not read; convert the Hugging Face checkpoint instead")
    arch = reader.fields["general.architecture"].contents()
    if arch not in GGUF_ARCHS:
        raise UserError(f"{gguf_path} holds a '{arch}' model (supported GGUF architectures: {', '.join(GGUF_ARCHS)})")
    return arch


def with_dropped_keys(hf: dict, fields: dict[str, object]) -> dict:
    """transformers' config dict of a GGUF plus what its mapping drops from a file of one of our families (``fields``:
    metadata key -> value): head_dim (qwen3), Gemma's attention scale by llama.cpp's rule, the soft-caps llama.cpp
    applies, the global rope scaling, no window where llama.cpp applies none (a "llama" file named Mistral). The dict,
    not a ModelConfig, is changed: it is what a converted copy's config.json says."""
    fam = FAMILIES.get(hf["model_type"])
    if fam is None:  # phi3: transformers reads all of it (scalings are refused above)
        return hf
    key = {k.removeprefix(f"{fam.arch}."): v for k, v in fields.items() if k.startswith(f"{fam.arch}.")}
    out = dict(hf)
    if fam.drop_windows:  # transformers' Mistral default is a 4096-token window; llama.cpp's llama attends to all tokens
        out["sliding_window"] = None
    if "attention.key_length" in key:
        out["head_dim"] = int(key["attention.key_length"])
    out |= {name: float(key[name]) for name in fam.caps if name in key}  # absent: llama.cpp's defaults, transformers' too
    if fam.wide_scale_layers:
        out["query_pre_attn_scalar"] = query_scalar(ModelConfig.from_hf(out), fam)
    kind = key.get("rope.scaling.type")
    if kind in READ_ROPE_TYPES:
        if "rope.scaling.factor" not in key:
            raise UserError(f"this GGUF's {fam.arch}.rope.scaling.type is {kind} but it has no {fam.arch}.rope.scaling.factor; "
                            "the file is incomplete: convert the Hugging Face checkpoint instead")
        rope = copy.deepcopy(hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": hf.get("rope_theta", 10000.0)})
        glob = rope.get("full_attention", rope)  # Gemma 3: per layer type, the scaling is the global layers'
        glob |= {"rope_type": kind, "factor": float(key["rope.scaling.factor"])}
        if "rope.scaling.original_context_length" in key:
            glob["original_max_position_embeddings"] = int(key["rope.scaling.original_context_length"])
        out["rope_parameters"] = rope
    return out


def gguf_config(gguf_path: Path) -> ModelConfig:
    """The model config of a GGUF of one of GGUF_ARCHS, from its metadata alone."""
    from transformers import AutoConfig

    gguf_path = Path(gguf_path)
    reader = open_reader(gguf_path)  # one parse of the header, for the checks and the keys
    arch = supported_gguf(gguf_path, reader)
    try:
        hf = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{gguf_path} could not be read as a '{arch}' GGUF: {str(e).splitlines()[0]}") from e
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
    return ModelConfig.from_hf(with_dropped_keys(hf.to_dict(), fields))


def gguf_decoder(gguf_path: Path) -> "torch.nn.Module":
    """A GGUF of one of GGUF_ARCHS as an fp32 Decoder: transformers' reader dequantizes every tensor."""
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    cfg = gguf_config(gguf_path)
    try:
        hf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, gguf_file=gguf_path.name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{gguf_path} could not be read as a '{cfg.model_type}' GGUF: {str(e).splitlines()[0]}") from e
    # transformers keeps a GGUF quantizer attached that makes save_pretrained refuse, so the
    # weights go through our own decoder and writer instead (logits are identical).
    return load_weights(build(cfg), dict(hf.state_dict()))


def save_gguf_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(Path(gguf_path).parent, gguf_file=Path(gguf_path).name).save_pretrained(out_dir)
