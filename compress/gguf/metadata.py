"""The model a GGUF file describes: its architecture, its config (transformers' mapping of the metadata keys plus what
that mapping drops), and transformers' whole-model reading for the files our block-by-block reader does not take.

transformers' GGUF config mapping ignores Gemma 2's soft-cap keys, leaves Gemma's query_pre_attn_scalar at its
default 256 (llama.cpp computes the attention scale from the shape instead: family.llama_cpp_scale) and refuses nothing
about "{arch}.rope.scaling.*": a Gemma 2 with other caps or head_dim, or a Gemma 3 4B file (linear scaling 8 on its
global layers), read through that mapping alone computes other logits. ``gguf_config`` puts them back.
"""

import copy
from pathlib import Path

import torch

from compress.errors import UserError
from compress.gguf.family import FAMILIES, llama_cpp_scale
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights, save_decoder

# GGUF names of our families that transformers' GGUF reader loads (Mistral and SmolLM2 files say "llama"; "gemma3" is
# Gemma 3's text decoder).
GGUF_ARCHS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3")
READ_ROPE_TYPES = ("none", "", "linear", "yarn")  # "{arch}.rope.scaling.type" values gguf_config reads

# Rotary scaling nothing here reads: tensors (Llama 3.1's rope_freqs, Phi-3's longrope factors) and other
# ARCH.rope.scaling.type keys; a model converted without them computes other logits.
DROPPED_GGUF_TENSORS = ("rope_freqs.", "rope_factors_")
CAPS = ("attn_logit_softcapping", "final_logit_softcapping")  # "{arch}.*" keys and config.json keys alike


def dropped_rope(reader) -> list[str]:
    tensors = {t.name for t in reader.tensors if t.name.startswith(DROPPED_GGUF_TENSORS)}
    keys = {k for k, f in reader.fields.items() if k.endswith(".rope.scaling.type") and f.contents() not in READ_ROPE_TYPES}
    return sorted(tensors | keys)


def open_reader(path: Path):
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (ValueError, KeyError, OSError) as e:
        raise UserError(f"{path} is not a readable GGUF file ({e})") from e


def gguf_architecture(path: Path) -> str:
    """The GGUF's general.architecture; refused where a conversion would drop its rotary scaling."""
    reader = open_reader(path)
    if "general.architecture" not in reader.fields:
        raise UserError(f"{path} is not a readable GGUF file (no general.architecture key)")
    dropped = dropped_rope(reader)
    if dropped:
        raise UserError(f"{path} scales its rotary embedding ({', '.join(dropped)}) in a way that this reader does not "
                        "read; convert the Hugging Face checkpoint instead")
    return reader.fields["general.architecture"].contents()


def supported_gguf(gguf_path: Path) -> str:
    """The GGUF's architecture, one of GGUF_ARCHS (else one line)."""
    arch = gguf_architecture(gguf_path)
    if arch not in GGUF_ARCHS:
        raise UserError(f"{gguf_path} holds a '{arch}' model (supported GGUF architectures: {', '.join(GGUF_ARCHS)})")
    return arch


def with_dropped_keys(hf: dict, fields: dict[str, object]) -> dict:
    """transformers' config dict of a GGUF plus what its mapping drops from a file of one of our families (``fields``:
    metadata key -> value): Gemma's attention scale by llama.cpp's rule, soft-caps, the global rope scaling. The dict,
    not the ModelConfig, is changed: its keys are what a converted checkpoint's config.json says."""
    cfg = ModelConfig.from_hf(hf)
    fam = FAMILIES.get(cfg.model_type)
    if fam is None:  # phi3: transformers reads all of it (longrope is refused above)
        return hf
    key = {k.removeprefix(f"{fam.arch}."): v for k, v in fields.items() if k.startswith(f"{fam.arch}.")}
    out = hf | {name: float(key[name]) for name in CAPS if name in key}
    if fam.wide_scale_layers:
        out["query_pre_attn_scalar"] = round(llama_cpp_scale(cfg, fam) ** -2)  # an int to transformers: head_dim or hidden / heads
    kind = key.get("rope.scaling.type")
    if kind in ("linear", "yarn"):
        rope = copy.deepcopy(hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": cfg.rope_theta})
        glob = rope.get("full_attention", rope)  # Gemma 3: per layer type, the scaling is the global layers'
        glob |= {"rope_type": kind, "factor": float(key["rope.scaling.factor"])}
        if kind == "yarn":
            glob["original_max_position_embeddings"] = int(key["rope.scaling.original_context_length"])
        out["rope_parameters"] = rope
    return out


def gguf_config(gguf_path: Path) -> ModelConfig:
    """The model config of a GGUF of one of GGUF_ARCHS, from its metadata alone."""
    from transformers import AutoConfig

    gguf_path = Path(gguf_path)
    arch = supported_gguf(gguf_path)
    try:
        hf = AutoConfig.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{gguf_path} could not be read as a '{arch}' GGUF: {str(e).splitlines()[0]}") from e
    fields = {k: f.contents() for k, f in open_reader(gguf_path).fields.items() if not k.startswith("tokenizer.")}
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


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF of one of GGUF_ARCHS into an fp32 HF safetensors directory (+ tokenizer)."""
    save_decoder(gguf_decoder(gguf_path), out_dir)
    save_gguf_tokenizer(gguf_path, out_dir)
