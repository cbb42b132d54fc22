"""--ignore: Linears kept unquantized by name or re:REGEX, written to compressed-tensors' ignore list and read back."""

import json

import pytest
import torch
from torch import nn

from compress.commands.quantize import run_quantize
from compress.errors import UserError
from compress.models import load_model, open_model
from compress.quant.config import QuantConfig
from compress.quant.ignore import ignored_names, matches
from compress.quant.linear import Fp8Linear, Int8OutlierLinear, PackedLinear
from tests.conftest import run_main

CALIB = dict(calib_samples=4, calib_seq_len=32, search_sequences=2, search_tokens=64)
DOWN0 = "model.layers.0.mlp.down_proj"
QKV1 = "re:model\\.layers\\.1\\.self_attn\\.[qkv]_proj"  # the whole fused set
KEPT = {DOWN0, "model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"}


def test_matches_full_names_and_regexes_from_the_start():
    assert matches(DOWN0, DOWN0) and not matches("mlp.down_proj", DOWN0)
    assert matches("re:.*down_proj", DOWN0) and matches("re:model\\.layers\\.0\\.", DOWN0)
    assert not matches("re:down_proj", DOWN0)  # anchored at the start, as compressed-tensors matches


def test_names_are_checked_against_the_model(tiny_dir):
    model = open_model(tiny_dir)
    assert ignored_names(model, [DOWN0, QKV1]) == KEPT
    assert ignored_names(model, ["lm_head"]) == set()  # always unquantized: accepted, changes nothing
    with pytest.raises(UserError, match="matches no Linear.*names look like model.layers"):
        ignored_names(model, ["model.layers.0.mlp.down"])
    with pytest.raises(UserError, match="part of .*q_proj.*k_proj.*v_proj.*one fused layer.*ignore all of them or none"):
        ignored_names(model, ["model.layers.1.self_attn.k_proj"])
    with pytest.raises(UserError, match="part of model.layers.0.mlp.gate_proj, model.layers.0.mlp.up_proj"):
        ignored_names(model, ["model.layers.0.mlp.up_proj"])


def test_a_moe_layers_experts_go_together_and_the_shared_expert_alone(tmp_path, smollm2_dir):
    from tests.conftest import save_hf, tiny_hf
    from tests.families import MOE_FAMILIES

    shape = MOE_FAMILIES["qwen2_moe"] | {"decoder_sparse_step": 1}  # both layers sparse, each with a shared expert
    src = save_hf(tiny_hf("qwen2_moe", vocab=49152, **shape), tmp_path / "moe", smollm2_dir)
    model = open_model(src)
    shared = ignored_names(model, ["re:model\\.layers\\.0\\.mlp\\.shared_expert\\."])
    assert shared == {f"model.layers.0.mlp.shared_expert.{k}_proj" for k in ("gate", "up", "down")}
    experts = ignored_names(model, ["re:model\\.layers\\.1\\.mlp\\.experts\\."])
    assert len(experts) == 3 * model.cfg.moe.num_experts
    with pytest.raises(UserError, match="part of model.layers.1.mlp.experts.0.gate_proj ... model.layers.1.mlp.experts.3.down_proj"):
        ignored_names(model, ["model.layers.1.mlp.experts.2.down_proj"])
    out = tmp_path / "awq"
    run_quantize(str(src), QuantConfig(method="awq", group_size=16, **CALIB, ignore=["re:model\\.layers\\.0\\.mlp\\.shared_expert\\."]), str(out))
    kept = load_model(out).model.layers[0].mlp.shared_expert
    assert all(type(kept.get_submodule(f"{k}_proj")) is nn.Linear for k in ("gate", "up", "down"))
    assert isinstance(load_model(out).model.layers[0].mlp.experts[0].gate_proj, PackedLinear)


@pytest.mark.parametrize("bad, why", [
    (dict(ignore=["re:("]), "not a regular expression"),
    (dict(ignore=[DOWN0], format="gguf"), "--format gguf cannot hold unquantized"),
])
def test_bad_ignore_options_are_refused(bad, why):
    with pytest.raises(UserError, match=why):
        QuantConfig(**bad)


@pytest.mark.parametrize("cfg, kind", [
    (QuantConfig(method="fp8", **CALIB), Fp8Linear),
    (QuantConfig(method="awq", bits=4, **CALIB), PackedLinear),
    (QuantConfig(method="int8", **CALIB), Int8OutlierLinear),
], ids=["fp8", "awq", "int8"])
def test_ignored_linears_are_written_and_read_back_unquantized(cfg, kind, tiny_dir, data_dir, tmp_path):
    plain = tmp_path / "plain"
    run_quantize(str(tiny_dir), cfg, str(plain))
    cfg.ignore = [DOWN0, QKV1]
    out = tmp_path / "out"
    run_quantize(str(tiny_dir), cfg, str(out))
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert KEPT <= set(ignore) and "lm_head" in ignore
    src, model = load_model(tiny_dir), load_model(out)
    for name, module in model.named_modules():
        if name in KEPT:
            assert type(module) is nn.Linear
            # no scale searched for a set kept whole: the source's weights exactly, but for AWQ's v_proj, which takes
            # o_proj's scale (v -> o): its rows divided, exactly as any other fold
            if not (cfg.method == "awq" and name.endswith("v_proj")):
                assert torch.equal(module.weight, src.get_submodule(name).weight), name
        elif name.startswith("model.layers.") and name.endswith("_proj"):
            assert isinstance(module, kind), name
    ids = torch.arange(24)[None] % 200
    ref = src(ids)
    err = lambda m: (m(ids) - ref).abs().mean()  # noqa: E731
    assert err(model) < err(load_model(plain))  # fewer Linears rounded: closer to the source


def test_autoawq_files_keep_ignored_linears_plain_and_name_them_for_transformers_and_vllm(tiny_dir, data_dir, tmp_path):
    from transformers.quantizers.quantizers_utils import should_convert_module

    from compress.model.checkpoint import Checkpoint

    out, ct = tmp_path / "awq", tmp_path / "ct"
    cfg = dict(method="awq", bits=4, **CALIB, ignore=[DOWN0, QKV1])
    run_quantize(str(tiny_dir), QuantConfig(**cfg, format="awq"), str(out))
    run_quantize(str(tiny_dir), QuantConfig(**cfg), str(ct))
    skips = json.loads((out / "config.json").read_text())["quantization_config"]["modules_to_not_convert"]
    qkv = [f"model.layers.1.self_attn.{k}_proj" for k in "qkv"]
    assert skips == ["lm_head", DOWN0, *qkv, "model.layers.1.self_attn.qkv_proj"]  # model order, then vLLM's fused names
    ckpt = Checkpoint(out)
    for name in ("model.layers.0.self_attn.q_proj", "model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"):
        assert f"{name}.qweight" in ckpt and f"{name}.weight" not in ckpt and should_convert_module(name, skips)
    for name in KEPT:
        assert f"{name}.weight" in ckpt and f"{name}.qweight" not in ckpt and not should_convert_module(name, skips)
    vllm_fused = ["model.layers.1.self_attn.qkv_proj", "model.layers.0.mlp.down_proj", "model.layers.0.self_attn.qkv_proj",
                  "model.layers.1.mlp.down_proj", "model.layers.0.mlp.gate_up_proj"]
    assert [any(s in prefix for s in skips) for prefix in vllm_fused] == [True, True, False, False, False]  # vLLM's test
    model, same = load_model(out), load_model(ct)
    assert all(type(model.get_submodule(n)) is nn.Linear for n in KEPT)
    assert isinstance(model.get_submodule("model.layers.1.self_attn.o_proj"), PackedLinear)
    ids = torch.arange(24)[None] % 200
    assert (model(ids) - same(ids)).abs().max() < 1e-2  # the same codes; fp16 against the source dtype's tensors


@pytest.mark.parametrize("args, fragment", [
    (("--ignore", "model.layers.1.self_attn.q_proj"), "ignore all of them or none"),
    (("--ignore", "model.layers.9.mlp.down_proj"), "matches no Linear"),
    (("--ignore", "re:[", "--method", "fp8"), "not a regular expression"),
])
def test_bad_ignore_on_the_command_line_is_one_line(args, fragment, tiny_dir, tmp_path, monkeypatch, capsys):
    from tests.test_bad_input import assert_one_line

    out = tmp_path / "out"
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(tiny_dir), "--method", "rtn", *args, "-o", str(out))
    assert_one_line(code, err, fragment)
    assert not out.exists()


def test_the_runtime_runs_a_checkpoint_with_ignored_linears(tiny_dir, tmp_path, monkeypatch, capsys):
    out = tmp_path / "fp8"
    args = ("quantize", str(tiny_dir), "--method", "fp8", "--rounding", "nearest", "--ignore", "re:.*mlp", "-o", str(out))
    assert run_main(monkeypatch, capsys, *args)[0] == 0
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    assert [n for n in ignore if "mlp" in n] == [f"model.layers.{i}.mlp.{k}_proj" for i in (0, 1) for k in ("gate", "up", "down")]
    code, text, err = run_main(monkeypatch, capsys, "generate", str(out), "The capital of France is", "--max-tokens", "4")
    assert code == 0 and text.strip(), err


def test_transformers_reads_the_ignore_list(fp_dir, tmp_path):
    """compressed-tensors (transformers' loader) keeps the ignored Linears plain and computes what our loader does."""
    pytest.importorskip("compressed_tensors")
    from transformers import AutoModelForCausalLM

    out = tmp_path / "fp8"
    run_quantize(str(fp_dir), QuantConfig(method="fp8", rounding="nearest", ignore=["re:model\\.layers\\.1\\."]), str(out))
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    schemes = {name: getattr(m, "quantization_scheme", None) for name, m in hf.named_modules() if name.endswith("_proj")}
    assert all((s is None) == name.startswith("model.layers.1.") for name, s in schemes.items()), schemes
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs, fp = load_model(out)(ids), hf(ids).logits, load_model(fp_dir)(ids)
    diff = (theirs - ours).abs()
    assert diff.median().item() <= 1e-6 and diff.max().item() <= 0.5 * (fp - ours).abs().max().item()
