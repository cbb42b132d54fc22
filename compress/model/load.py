"""Checkpoints <-> Decoder: read HF safetensors (sharded or not), write HF layout (GGUF files: compress/gguf/)."""

import json
from pathlib import Path

import torch

from compress.errors import UserError
from compress.model import lazy
from compress.model.checkpoint import Checkpoint
from compress.model.config import ModelConfig
from compress.model.decoder import Decoder
from compress.model.moe import hub_layout
from compress.model.shards import ShardWriter

TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "generation_config.json",
)


def read_config(model_dir: Path) -> dict:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise UserError(f"{model_dir} has no config.json; point MODEL at a Hugging Face model directory")
    try:
        cfg = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not valid JSON ({e}); re-download or fix the checkpoint's config.json") from e
    if not isinstance(cfg, dict):
        raise UserError(f"{path} holds a JSON {type(cfg).__name__}, not an object; re-download or fix the checkpoint's config.json")
    return cfg


def build(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Decoder:
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device="cpu").to(dtype)
    return model


def load_weights(model: Decoder, state: dict[str, torch.Tensor]) -> Decoder:
    """``state`` in the hub's layout, or a transformers model's in memory (its fused experts split, moe.py)."""
    state = hub_layout(state, model.cfg)
    if model.cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (k == "lm_head.weight" and model.cfg.tie_word_embeddings)]
    if missing or unexpected:
        raise UserError(f"checkpoint does not match its config: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if model.cfg.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model


def open_decoder(model_dir: Path) -> Decoder:
    """An unquantized HF checkpoint as a Decoder whose weights are read when a part is materialized (lazy.py)."""
    cfg = ModelConfig.from_hf(read_config(model_dir))
    ckpt = Checkpoint(model_dir)
    model = lazy.attach(lazy.skeleton(cfg), ckpt)
    check_names(model, ckpt)
    return model


def check_names(model: Decoder, ckpt: Checkpoint) -> None:
    """Every tensor the model needs is in the checkpoint, before any is read."""
    want = set(model.state_dict())
    if model.cfg.tie_word_embeddings:
        want.discard("lm_head.weight")
    missing = sorted(want - set(ckpt.keys()))
    if missing:
        raise UserError(f"{ckpt.dir} does not match its config.json: {len(missing)} tensors missing, e.g. {missing[0]}")


def load_decoder(model_dir: Path, dtype: torch.dtype = torch.float32) -> Decoder:
    """An unquantized HF checkpoint -> Decoder in eval mode, read tensor by tensor."""
    return lazy.materialize_all(open_decoder(model_dir), dtype)


def state_for_saving(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    return state


def write_checkpoint(out_dir: Path, state: dict[str, torch.Tensor], config: dict, source_dir: Path | None) -> None:
    """Sharded safetensors + config.json (+ the source's tokenizer files): the HF layout."""
    writer = ShardWriter(out_dir)
    writer.add(state)
    finish_checkpoint(out_dir, writer, config, source_dir)


def finish_checkpoint(out_dir: Path, writer: ShardWriter, config: dict, source_dir: Path | None) -> None:
    """Close the shards of ``writer`` and write config.json and the tokenizer beside them."""
    writer.close()
    (Path(out_dir) / "config.json").write_text(json.dumps(config, indent=2))
    if source_dir is not None:
        copy_tokenizer(source_dir, out_dir)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def save_decoder(model: Decoder, out_dir: Path, source_dir: Path | None = None) -> None:
    """Write an HF checkpoint that AutoModelForCausalLM loads with no extra code."""
    cfg = model.cfg.to_hf() | {"torch_dtype": dtype_name(next(model.parameters()).dtype)}
    write_checkpoint(out_dir, state_for_saving(model), cfg, source_dir)


def copy_tokenizer(src: Path, dst: Path) -> None:
    for name in TOKENIZER_FILES:
        f = Path(src) / name
        if f.is_file():
            (Path(dst) / name).write_bytes(f.read_bytes())
