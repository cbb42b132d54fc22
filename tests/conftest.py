"""Shared fixtures: tiny random Llama-family checkpoints built in code, and the real default model."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not torch.cuda.is_available():  # before anything imports Triton: it fixes interpret-or-compile for triton.language
    os.environ["TRITON_INTERPRET"] = "1"  # then (tl.zeros & co.), so a kernel run on CPU tensors by any test needs it set first
DATA = Path(os.environ.get("COMPRESS_DATA_DIR", Path(__file__).parents[1] / ".." / "shared" / "data"))


def tiny_hf(kind: str = "llama", vocab: int = 256, seed: int = 0, features: bool = False, **overrides):
    """A random transformers model of the given family (a model_type), small enough for a unit test;
    ``features``: with every optional feature of the family switched on (tests/families.py)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.families import FAMILIES

    kw = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, pad_token_id=None)
    kw |= (FAMILIES[kind] if features else {}) | overrides
    config = AutoConfig.for_model(kind, **kw)
    config._attn_implementation = "eager"  # the reference implementation; soft-capping families need it
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():  # transformers zero-initialises biases and ones norms; make every tensor matter
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_hf(model, path: Path, tokenizer_dir: Path | None = None) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    if tokenizer_dir is not None:
        for f in tokenizer_dir.iterdir():
            if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
                (path / f.name).write_bytes(f.read_bytes())
    return path


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    from compress.errors import UserError
    from compress.models import resolve

    try:
        return resolve("smollm2-135m")
    except UserError as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA / "wikitext2" / "wiki.test.raw").is_file():
        pytest.skip(f"shared data not found at {DATA}; set COMPRESS_DATA_DIR")
    os.environ["COMPRESS_DATA_DIR"] = str(DATA)
    return DATA


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, smollm2_dir) -> Path:
    """A 2-layer random Llama with SmolLM2's tokenizer (vocab 49152), saved as an HF checkpoint."""
    model = tiny_hf("llama", vocab=49152, tie_word_embeddings=True)
    return save_hf(model, tmp_path_factory.mktemp("tiny") / "model", smollm2_dir)


def gguf_and_reading(root: Path, smollm2_dir: Path, gguf_type: str, **shape) -> tuple[Path, Path]:
    """(a GGUF of gguf_type by RTN from a 2-layer random Llama of this shape, its reading keeping the codes)."""
    from compress.commands.quantize_gguf import run_quantize_gguf
    from compress.gguf import reader
    from compress.quant.config import QuantConfig

    src = save_hf(tiny_hf("llama", vocab=49152, **shape), root / "src", smollm2_dir)
    path = run_quantize_gguf(str(src), QuantConfig(method="rtn", format="gguf", gguf_type=gguf_type), str(root / "m.gguf"))
    (root / "read").mkdir()
    reader.convert(Path(path), root / "read")
    return Path(path), root / "read"


@pytest.fixture(scope="session")
def q4_k_m_gguf(tmp_path_factory, smollm2_dir) -> tuple[Path, Path]:
    """(a Q4_K_M GGUF of a 2-layer random Llama, its reading keeping the codes): hidden 320 is no multiple of Q4_K's
    256, so q/k/v/o/gate/up fall back to Q5_0 and layer 1's attn_v to Q8_0 (llama.cpp's rule); ffn_down (512 inputs)
    is Q4_K in layer 0 and Q6_K in layer 1: every type a Q4_K_M file holds."""
    return gguf_and_reading(tmp_path_factory.mktemp("q4_k_m"), smollm2_dir, "Q4_K_M", hidden_size=320, intermediate_size=512)


@pytest.fixture(scope="session")
def q4_0_gguf(tmp_path_factory, smollm2_dir) -> tuple[Path, Path]:
    """(a Q4_0 GGUF of a 2-layer random Llama, its reading keeping the codes): every Linear Q4_0."""
    return gguf_and_reading(tmp_path_factory.mktemp("q4_0"), smollm2_dir, "Q4_0")


@pytest.fixture
def fp_dir(tmp_path) -> Path:
    """A 2-layer random fp32 Llama (vocab 256, no tokenizer) saved as an HF checkpoint."""
    return save_hf(tiny_hf("llama"), tmp_path / "fp")


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


@pytest.fixture(scope="session")
def tiny_int4_dir(tmp_path_factory, tiny_dir) -> Path:
    """tiny_dir quantized with RTN int4 (group size 64), exported as compressed-tensors."""
    from compress.quant.config import QuantConfig
    from compress.commands.quantize import run_quantize

    return run_quantize(str(tiny_dir), QuantConfig(method="rtn", bits=4), str(tmp_path_factory.mktemp("quant") / "rtn-int4"))


def run_main(monkeypatch, capsys, *argv) -> tuple[int, str, str]:
    """`compress ARGV...` in this process, as the console script runs it: (exit code, stdout, stderr)."""
    from compress.cli import main

    monkeypatch.setattr(sys, "argv", ["compress", *argv])
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def model_and_text(tmp_path, smollm2_dir) -> tuple[Path, Path]:
    """A tiny Llama with SmolLM2's tokenizer (tied embeddings, 3 layers) and a text file to distill on."""
    model = save_hf(tiny_hf("llama", vocab=49152, tie_word_embeddings=True, num_hidden_layers=3), tmp_path / "m", smollm2_dir)
    text = tmp_path / "text.txt"
    text.write_text("\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(200)))
    return model, text


def launch_command(processes: int, *args: str, fsdp: bool = False) -> tuple[list[str], dict[str, str]]:
    """(argv, env) of `accelerate launch --multi_gpu --num_processes N ARGS` (fsdp: `--use_fsdp --fsdp_version 2`):
    gloo on CPU without CUDA, one thread a process, a free port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mode = ["--use_fsdp", "--fsdp_version", "2"] if fsdp else ["--multi_gpu"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", str(processes),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
           *args]
    return cmd, {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}


def launch(processes: int, *args: str, timeout: int = 600, fsdp: bool = False) -> subprocess.CompletedProcess:
    cmd, env = launch_command(processes, *args, fsdp=fsdp)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
