"""Checkpoints <-> Decoder: read HF safetensors (sharded or not) and GGUF, write HF layout."""

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder, rope_inv_freq

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json",
)


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{model_dir} has no config.json; point MODEL at a Hugging Face model directory")
    return json.loads(path.read_text())


def weight_files(model_dir: Path) -> list[Path]:
    model_dir = Path(model_dir)
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [model_dir / s for s in shards]
    files = sorted(model_dir.glob("*.safetensors"))
    if files:
        return files
    if list(model_dir.glob("*.bin")) or list(model_dir.glob("*.pt")):
        raise UserError(
            f"{model_dir} holds only pickle weights (.bin/.pt), which can run code when loaded; "
            "convert them to safetensors first (e.g. transformers' save_pretrained(safe_serialization=True))"
        )
    raise UserError(f"{model_dir} has no *.safetensors weights")


def read_state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    state = {}
    for f in weight_files(model_dir):
        state.update(load_file(str(f)))
    return state


def build(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Decoder:
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    model.inv_freq = rope_inv_freq(cfg)  # the meta device gave it no values
    return model


def load_weights(model: Decoder, state: dict[str, torch.Tensor]) -> Decoder:
    if model.cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise UserError(f"checkpoint does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if model.cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def load_decoder(model_dir: Path, dtype: torch.dtype = torch.float32) -> Decoder:
    """An unquantized HF checkpoint -> Decoder in eval mode."""
    cfg = ModelConfig.from_hf(read_config(model_dir))
    state = {k: v.to(dtype) for k, v in read_state_dict(model_dir).items()}
    return load_weights(build(cfg, dtype), state).eval()


def state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def write_checkpoint(out_dir: Path, state: dict[str, torch.Tensor], config: dict, source_dir: Path | None) -> None:
    """model.safetensors + config.json (+ the source's tokenizer files): the HF layout."""
    out_dir = Path(out_dir)
    save_file(state, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2))
    if source_dir is not None:
        copy_tokenizer(source_dir, out_dir)


def save_decoder(model: Decoder, out_dir: Path, source_dir: Path | None = None) -> None:
    """Write an HF checkpoint that AutoModelForCausalLM loads with no extra code."""
    cfg = model.cfg.to_hf() | {"torch_dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}
    write_checkpoint(out_dir, state_for_saving(model), cfg, source_dir)


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            (Path(dst) / name).write_bytes(f.read_bytes())


GGUF_ARCHS = ("llama", "qwen2")  # GGUF names; Mistral and SmolLM2 files say "llama"


def gguf_architecture(path: Path) -> str:
    from gguf import GGUFReader

    try:
        field = GGUFReader(str(path)).fields["general.architecture"]
    except (ValueError, KeyError, OSError) as e:
        raise UserError(f"{path} is not a readable GGUF file ({e})") from e
    return bytes(field.parts[field.data[0]]).decode()


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a Llama-family GGUF into an fp32 HF safetensors directory (+ tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path = Path(gguf_path)
    arch = gguf_architecture(gguf_path)
    if arch not in GGUF_ARCHS:
        raise UserError(f"{gguf_path} holds a '{arch}' model, not a Llama-family one (supported GGUF architectures: {', '.join(GGUF_ARCHS)})")
    kwargs = dict(gguf_file=gguf_path.name)
    try:
        hf = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kwargs)
    except (ValueError, KeyError, RuntimeError) as e:
        raise UserError(f"{gguf_path} could not be read as a Llama-family GGUF: {str(e).splitlines()[0]}") from e
    # transformers keeps a GGUF quantizer attached that makes save_pretrained refuse, so the
    # weights go through our own decoder and writer instead (logits are identical).
    cfg = ModelConfig.from_hf(hf.config.to_dict())
    model = load_weights(build(cfg), dict(hf.state_dict()))
    save_decoder(model, out_dir)
    AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs).save_pretrained(out_dir)
