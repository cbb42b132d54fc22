"""Quantization of every family (tests/families.py, every feature on): exports that transformers loads with the
family's own class and runs token for token as we do, folds that keep the function, AWQ ahead of RTN."""

import json

import pytest
import torch

from compress.model.arch import ARCHS
from compress.model.checkpoint import Checkpoint
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.awq_apply import fold_scales, head_mapping
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.swap import quantized_linears
from tests.conftest import save_hf, tiny_hf
from tests.families import FAMILIES

G = 32  # divides every tiny width: hidden 64, MLP 128, o_proj's 4 heads x 24 (qwen3, gemma)
PROMPT = torch.tensor([[5, 17, 99, 3, 250, 42, 7, 128, 64, 1, 33, 200]])
OUTLIERS = [3, 17, 40]
AWQ = dict(method="awq", group_size=G, grid=10, search_sequences=2, search_tokens=128)
# Per-layer config lists are saved the way transformers writes them; the dtype is the export's own.
OWN_KEYS = ("quantization_config", "torch_dtype", "dtype", "transformers_version")


def calib() -> torch.Tensor:
    return torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))


def export(tmp_path, kind: str, cfg: QuantConfig):
    hf = tiny_hf(kind, features=True)
    src = save_hf(hf, tmp_path / "src")
    model, out = load_model(src), tmp_path / "out"
    out.mkdir()
    write_quantized(model, quantize(model, cfg, calib()), out, src)
    return hf, src, out


def greedy(forward, n: int = 8) -> list[int]:
    ids = PROMPT
    with torch.no_grad():
        for _ in range(n):
            ids = torch.cat([ids, forward(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, PROMPT.shape[1]:].tolist()


def transformers_model(out, kind: str, **kw):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager", **kw)
    assert type(hf).__name__ == ARCHS[kind].hf_class
    return hf


def check_same_layout(hf, src, out) -> None:
    """config.json keeps every key of the source, and every source tensor is there by its own name (Phi-3's
    qkv_proj stays fused): as is, or as a quantized Linear's weight_packed / int8 or fp8 weight."""
    before, after = (json.loads((d / "config.json").read_text()) for d in (src, out))
    assert {k: v for k, v in before.items() if k not in OWN_KEYS} == {k: after.get(k) for k in before if k not in OWN_KEYS}
    ckpt = Checkpoint(out)
    missing = [n for n in hf.state_dict() if n not in ckpt and n.replace(".weight", ".weight_packed") not in ckpt]
    assert not missing


@pytest.mark.parametrize("method", ["rtn", "awq"])
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_int4_export_runs_in_transformers_as_in_ours(tmp_path, kind, method):
    pytest.importorskip("compressed_tensors")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    cfg = QuantConfig(**AWQ) if method == "awq" else QuantConfig(method="rtn", group_size=G)
    hf, src, out = export(tmp_path, kind, cfg)
    check_same_layout(hf, src, out)
    # asymmetric zero points: compressed-tensors 0.20 loads them decompressed only (docs/formats.md)
    theirs = transformers_model(out, kind, quantization_config=CompressedTensorsConfig(dequantize=True))
    ours = load_model(out)
    assert greedy(lambda ids: theirs(ids).logits) == greedy(ours)
    with torch.no_grad():
        assert (theirs(PROMPT).logits - ours(PROMPT)).abs().max().item() <= 1e-3


@pytest.mark.parametrize("cfg", [QuantConfig(method="rtn", bits=3, group_size=G), QuantConfig(method="fp8")],
                         ids=["int3", "fp8"])
@pytest.mark.parametrize("kind", list(FAMILIES))
def test_int3_and_fp8_exports_load_in_transformers(tmp_path, kind, cfg):
    pytest.importorskip("compressed_tensors")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    hf, src, out = export(tmp_path, kind, cfg)
    check_same_layout(hf, src, out)
    # fp8: a plain from_pretrained keeps the activation scheme (dequantize=True would drop it)
    kw = {} if cfg.method == "fp8" else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    theirs = transformers_model(out, kind, **kw)
    with torch.no_grad():
        assert (theirs(PROMPT).logits - load_model(out)(PROMPT)).abs().max().item() <= 1e-3


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_int8_export_loads_in_ours(tmp_path, kind):
    _, src, out = export(tmp_path, kind, QuantConfig(method="int8"))
    fp, q = load_model(src), load_model(out)
    with torch.no_grad():
        a, b = fp(PROMPT), q(PROMPT)
    assert 0 < (a - b).norm() / a.norm() < 0.05


@pytest.mark.parametrize("kind", ["phi3", "gemma2", "olmo2"])
def test_autoawq_gemm_export_of_other_families_reads_back(tmp_path, kind):
    """Each Linear as the family stores it (Phi-3's qkv_proj is one WQLinear): the same codes come back, the
    scales and other tensors in fp16 (the format's dtype)."""
    src = save_hf(tiny_hf(kind, features=True), tmp_path / "src")
    model, out = load_model(src), tmp_path / "out"
    out.mkdir()
    write_quantized(model, quantize(model, QuantConfig(method="rtn", group_size=G)), out, src, "awq")
    assert all(f"{name}.qweight" in Checkpoint(out) for name in quantized_linears(model))
    with torch.no_grad():
        a, b = model(PROMPT), load_model(out)(PROMPT)
    assert (a - b).abs().max().item() <= 1e-2 * a.abs().max().item()


def ours(hf):
    return load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_folded_scales_keep_the_function(kind):
    """Into x * w and x * (1 + w) norms, v -> o with head_dim apart from hidden / heads, Phi-3's fused groups."""
    model = ours(tiny_hf(kind, features=True))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        before = model(PROMPT)
        for block in model.model.layers:
            for group in filter(lambda g: g.prev, model.cfg.arch.scale_groups):
                _, expand = head_mapping(block, group, model.cfg.head_dim)
                width = block.get_submodule(group.prev).weight.shape[0]
                fold_scales(block, group, torch.rand(width, generator=gen) * 4 + 0.25, expand)
        after = model(PROMPT)
    assert (after - before).abs().max().item() <= 1e-4 * before.abs().max().item()


def planted(kind: str):
    """A tiny model with a few loud input channels, as real LLMs have: in the residual stream (which OLMo 2's groups
    read raw), and 30x larger out of every norm that feeds a group (the Linears' columns / 30: the same function)."""
    model = ours(tiny_hf(kind, features=True))
    s = torch.ones(model.cfg.hidden_size)
    s[OUTLIERS] = 1 / 30
    with torch.no_grad():
        model.model.embed_tokens.weight[:, OUTLIERS] *= 10
        for block in model.model.layers:
            for group in model.cfg.arch.scale_groups:
                if group.prev in model.cfg.arch.norms.names():
                    fold_scales(block, group, s, lambda v: v)
    return model


@pytest.mark.parametrize("kind", list(FAMILIES))
def test_awq_beats_rtn_with_planted_outliers(kind):
    ids = torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = planted(kind)(ids)
    rtn, awq = planted(kind), planted(kind)
    quantize(rtn, QuantConfig(method="rtn", group_size=G))
    quantize(awq, QuantConfig(**AWQ), calib())
    with torch.no_grad():
        mse = [(m(ids) - ref).pow(2).mean().item() for m in (rtn, awq)]
    assert mse[1] < 0.8 * mse[0]
