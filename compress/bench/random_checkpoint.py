"""Random-weight checkpoints of real shapes, of any family we run, written shard by shard.

    python -m compress.bench.random_checkpoint llama3-8b DIR [--shard-bytes N] [--seed 0]
    write_random_checkpoint(DIR, SHAPES["llama3-8b"])   # ~14.8 GB bf16, 8 shards of <= 2 GB

The layout is Hugging Face's: config.json, model-0000X-of-0000N.safetensors, and
model.safetensors.index.json = {"metadata": {"total_size": ...}, "weight_map": {name: shard}},
plus SmolLM2's tokenizer files (its 49,152 ids index the first rows of a shape's vocabulary, which may be larger). Tensors are planned
into shards by size first, then generated one at a time from a seeded generator; only the
current shard's tensors are held, and they are dropped once saved. The tensor names and sizes are
those of our decoder built (on the meta device) from the shape's config.json, so every family's own
layout (q/k norms, Gemma's four norms, Phi-3's fused projections, a mixture of experts' router and per-expert
Linears as the hub stores them) is written. Linears and embeddings
are normal * 0.02, norms the identity (ones; zeros for Gemma's (1 + w) form). The directory is built in a hidden sibling and renamed into place;
an existing complete checkpoint with the same config.json is reused.
"""

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import click
import torch
from safetensors.torch import save_file

SHARD_BYTES = 2 * 10**9
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@dataclass(frozen=True)
class Shape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int | None = None  # default: hidden // heads
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    vocab: int = 49152  # SmolLM2's tokenizer (a larger vocabulary keeps its ids: they index the first rows)
    model_type: str = "llama"
    extra: dict = field(default_factory=dict)  # the family's own config.json keys

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden // self.heads


SHAPES = {
    "llama3-8b": Shape(4096, 14336, 32, 32, 8, head_dim=128, rope_theta=500000.0, max_position_embeddings=8192),
    "tinyllama-1.1b": Shape(2048, 5632, 22, 32, 4, max_position_embeddings=2048),
    "tiny": Shape(64, 128, 2, 4, 2, max_position_embeddings=2048),
    "qwen3-8b": Shape(4096, 12288, 36, 32, 8, head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960, vocab=151936,
                      model_type="qwen3"),
    "gemma2-9b": Shape(3584, 14336, 42, 16, 8, head_dim=256, max_position_embeddings=8192, vocab=256000, tie_word_embeddings=True,
                       model_type="gemma2", extra={"query_pre_attn_scalar": 256, "sliding_window": 4096, "hidden_activation": "gelu_pytorch_tanh",
                                                   "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6}),
    # Qwen3-30B-A3B's first 8 of 48 layers (~11 GB bf16): 128 experts of width 768, 8 per token, every layer sparse
    "qwen3-30b-a3b-8l": Shape(2048, 6144, 8, 32, 4, head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960, vocab=151936,
                              model_type="qwen3_moe", extra={"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                                                             "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                                                             "rms_norm_eps": 1e-6}),
    # the dense Qwen3 that reads as many weights per token: its MLP as wide as the 8 active experts (8 x 768)
    "qwen3-dense-a3b-8l": Shape(2048, 6144, 8, 32, 4, head_dim=128, rope_theta=1000000.0, max_position_embeddings=40960, vocab=151936,
                                model_type="qwen3", extra={"rms_norm_eps": 1e-6}),
}


def tensor_specs(shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """(name, size) of every tensor, in HF naming and our decoder's order (a tied lm_head is not stored)."""
    from compress.model.config import ModelConfig
    from compress.model.lazy import skeleton

    model = skeleton(ModelConfig.from_hf(hf_config(shape, torch.bfloat16)))
    return [(name, tuple(p.shape)) for name, p in model.state_dict().items()
            if not (shape.tie_word_embeddings and name == "lm_head.weight")]


def numel(size: tuple[int, ...]) -> int:
    n = 1
    for s in size:
        n *= s
    return n


def plan_shards(specs, itemsize: int, shard_bytes: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Consecutive groups of specs of at most shard_bytes each (a larger single tensor gets its own shard)."""
    shards, current, used = [], [], 0
    for name, size in specs:
        nbytes = numel(size) * itemsize
        if current and used + nbytes > shard_bytes:
            shards.append(current)
            current, used = [], 0
        current.append((name, size))
        used += nbytes
    return shards + [current] if current else shards


def random_tensor(name: str, size: tuple[int, ...], dtype: torch.dtype, seed: int, norm_offset: float = 0.0) -> torch.Tensor:
    if name.endswith("norm.weight"):
        return torch.full(size, 1.0 - norm_offset, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(size, generator=gen, dtype=dtype).mul_(0.02)


def hf_config(shape: Shape, dtype: torch.dtype, tokenizer_dir: Path | None = None) -> dict:
    """config.json of the shape; bos/eos from the tokenizer's model (None without one)."""
    from compress.model.arch import ARCHS

    src = json.loads((Path(tokenizer_dir) / "config.json").read_text()) if tokenizer_dir else {}
    dtype_name = str(dtype).removeprefix("torch.")
    return {
        "architectures": [ARCHS[shape.model_type].hf_class], "model_type": shape.model_type, "vocab_size": shape.vocab,
        "hidden_size": shape.hidden, "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads, "head_dim": shape.dim,
        "hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": shape.rope_theta, "rope_scaling": None,
        "max_position_embeddings": shape.max_position_embeddings, "tie_word_embeddings": shape.tie_word_embeddings,
        "attention_bias": False, "mlp_bias": False, "bos_token_id": src.get("bos_token_id"),
        "eos_token_id": src.get("eos_token_id"), "torch_dtype": dtype_name, "dtype": dtype_name, **shape.extra,
    }


def is_complete(out_dir: Path, config: dict) -> bool:
    index, cfg = out_dir / "model.safetensors.index.json", out_dir / "config.json"
    if not (index.is_file() and cfg.is_file()) or json.loads(cfg.read_text()) != config:
        return False
    shards = set(json.loads(index.read_text())["weight_map"].values())
    return all((out_dir / s).is_file() for s in shards)


def write_shards(tmp: Path, shape: Shape, dtype: torch.dtype, shard_bytes: int, seed: int) -> dict:
    """Generate and save every shard; returns the index."""
    from compress.model.arch import ARCHS

    itemsize = torch.empty((), dtype=dtype).element_size()
    plan = plan_shards(tensor_specs(shape), itemsize, shard_bytes)
    offset = ARCHS[shape.model_type].norm_offset
    weight_map, total, k = {}, 0, 0
    for i, specs in enumerate(plan):
        fname = f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors"
        tensors = {}
        for name, size in specs:
            tensors[name] = random_tensor(name, size, dtype, seed + k, offset)
            weight_map[name], total, k = fname, total + tensors[name].nbytes, k + 1
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        del tensors  # the next shard starts from nothing
    return {"metadata": {"total_size": total}, "weight_map": weight_map}


def write_random_checkpoint(out_dir, shape: Shape, dtype: torch.dtype = torch.bfloat16, shard_bytes: int = SHARD_BYTES,
                            seed: int = 0, tokenizer_dir: Path | None = None) -> Path:
    """Write (or reuse) a random-weight checkpoint of `shape` at out_dir."""
    if tokenizer_dir is None:
        from compress import models

        tokenizer_dir = models.resolve(models.DEFAULT_MODEL)
    out_dir = Path(out_dir)
    config = hf_config(shape, dtype, tokenizer_dir)
    if is_complete(out_dir, config):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        index = write_shards(tmp, shape, dtype, shard_bytes, seed)
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        for f in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / f).is_file():
                shutil.copyfile(Path(tokenizer_dir) / f, tmp / f)
        shutil.rmtree(out_dir, ignore_errors=True)  # an incomplete or different checkpoint
        tmp.rename(out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


@click.command()
@click.argument("shape", type=click.Choice(sorted(SHAPES)))
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--shard-bytes", type=int, default=SHARD_BYTES, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
def main(shape, out_dir, shard_bytes, seed):
    """Write (or reuse) a random-weight bf16 checkpoint of SHAPE at OUT_DIR."""
    print(write_random_checkpoint(out_dir, SHAPES[shape], shard_bytes=shard_bytes, seed=seed))


if __name__ == "__main__":
    from compress.program import run_command

    run_command(main)
