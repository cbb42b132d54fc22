"""Quantization of mixtures of experts (Mixtral, Qwen2-MoE, Qwen3-MoE): every expert's Linears quantized, the routers
kept as they are and named in quantization_config.ignore, exports transformers runs token for token as we do, every
expert calibrated on every token (one the router never chooses too), the routed tokens counted in compress.json."""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.model.checkpoint import Checkpoint
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from compress.model.moe import SparseMoe
from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.quant.linear import PackedLinear
from compress.quant.moe_calib import RoutedTokens
from compress.quant.primitives import IntSpec
from tests.conftest import run_main, save_hf, tiny_hf
from tests.families import MOE_FAMILIES
from tests.quant.test_families_quant import PROMPT, calib, greedy, transformers_model

G = 16  # divides every tiny width: hidden 64, experts 48, shared expert 80, MLP 128
AWQ = dict(method="awq", group_size=G, grid=10, search_sequences=2, search_tokens=128)


def moe_hf(kind: str, **kw):
    return tiny_hf(kind, **MOE_FAMILIES[kind] | kw)


def export(tmp_path, kind: str, cfg: QuantConfig):
    src = save_hf(moe_hf(kind), tmp_path / "src")
    model, out = load_model(src), tmp_path / "out"
    out.mkdir()
    write_quantized(model, quantize(model, cfg, calib()), out, src)
    return src, out


def routers(model) -> list[str]:
    return [f"{name}.{r}" for name, m in model.named_modules() if isinstance(m, SparseMoe)
            for r in ("gate", "shared_expert_gate") if hasattr(m, r)]


def check_layout(src, out) -> None:
    """Every source tensor by its hub name (per expert), quantized or as is; the routers unquantized, in the ignore list."""
    ckpt, before = Checkpoint(out), load_file(src / "model.safetensors")
    assert all(n in ckpt or n.replace(".weight", ".weight_packed") in ckpt or n.replace(".weight", ".weight_scale") in ckpt
               for n in before)
    names = routers(load_model(src))
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert names and set(qc["ignore"]) == {"lm_head", *names}
    for n in names:  # in the source dtype, not quantized (AWQ and SmoothQuant fold their scale into them: W s)
        assert f"{n}.weight_scale" not in ckpt and ckpt.stored_dtype(f"{n}.weight") == before[f"{n}.weight"].dtype


@pytest.mark.parametrize("method", ["rtn", "awq"])
@pytest.mark.parametrize("kind", list(MOE_FAMILIES))
def test_int4_export_runs_in_transformers_as_in_ours(tmp_path, kind, method):
    pytest.importorskip("compressed_tensors")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    src, out = export(tmp_path, kind, QuantConfig(**AWQ) if method == "awq" else QuantConfig(method="rtn", group_size=G))
    check_layout(src, out)
    theirs = transformers_model(out, kind, quantization_config=CompressedTensorsConfig(dequantize=True))
    ours = load_model(out)
    assert greedy(lambda ids: theirs(ids).logits) == greedy(ours)
    with torch.no_grad():
        assert (theirs(PROMPT).logits - ours(PROMPT)).abs().max().item() <= 1e-3


@pytest.mark.parametrize("cfg", [QuantConfig(method="rtn", bits=3, group_size=G), QuantConfig(method="fp8")], ids=["int3", "fp8"])
@pytest.mark.parametrize("kind", list(MOE_FAMILIES))
def test_int3_and_fp8_exports_load_in_transformers(tmp_path, kind, cfg):
    pytest.importorskip("compressed_tensors")
    from transformers.utils.quantization_config import CompressedTensorsConfig

    src, out = export(tmp_path, kind, cfg)
    check_layout(src, out)
    kw = {} if cfg.method == "fp8" else {"quantization_config": CompressedTensorsConfig(dequantize=True)}
    theirs = transformers_model(out, kind, **kw)
    with torch.no_grad():
        a, b = theirs(PROMPT).logits, load_model(out)(PROMPT)
    # fp8: transformers runs the experts' weights dequantized on unrounded activations (its fused-experts path), we
    # round the activations to fp8 per token as vLLM does: the logits differ by that rounding
    assert (a - b).norm() / a.norm() <= (0.05 if cfg.method == "fp8" else 1e-5)


@pytest.mark.parametrize("kind", list(MOE_FAMILIES))
def test_int8_export_loads_in_ours(tmp_path, kind):
    src, out = export(tmp_path, kind, QuantConfig(method="int8"))
    fp, q = load_model(src), load_model(out)
    with torch.no_grad():
        a, b = fp(PROMPT), q(PROMPT)
    assert 0 < (a - b).norm() / a.norm() < 0.05
    assert all(type(q.get_submodule(n)) is torch.nn.Linear for n in routers(q))


def never_routed(kind: str, planted: int = 3):
    """A tiny model whose routers never choose expert ``planted``: channel 0 of the residual stream is a positive
    constant (the embeddings' column, and no Linear writes into it), and the planted expert's router row reads only
    that channel, with a large negative weight."""
    hf = moe_hf(kind)
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 3.0
        for block in model.model.layers:
            for name in block.linears:
                if block.get_submodule(name).out_features == model.cfg.hidden_size:  # o_proj and every down
                    block.get_submodule(name).weight[0] = 0
            for moe in filter(lambda m: isinstance(m, SparseMoe), block.modules()):
                moe.gate.weight[planted] = 0
                moe.gate.weight[planted, 0] = -100.0
    return model


def rounded(expert):
    """A copy of the expert with its Linears rounded to the nearest int4 (the MoE export's symmetric grid)."""
    expert = copy.deepcopy(expert)
    for n in expert.names:
        setattr(expert, n, PackedLinear.from_float(expert.get_submodule(n), IntSpec(4, G, True)))
    return expert


def moe_inputs(model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each MoE block's input [N, C] when model runs ids, by the block's name."""
    got = {}
    hooks = [m.register_forward_hook(lambda m, args, out, name=name: got.__setitem__(name, args[0].flatten(0, -2)))
             for name, m in model.named_modules() if isinstance(m, SparseMoe)]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return got


@pytest.mark.parametrize("kind", list(MOE_FAMILIES))
def test_expert_the_router_never_chooses_is_calibrated_on_every_token(kind):
    model, rtn, planted = never_routed(kind), never_routed(kind), 3
    moes = {name: copy.deepcopy(m) for name, m in model.named_modules() if isinstance(m, SparseMoe)}
    norms = {f"model.layers.{i}": getattr(b, model.cfg.arch.norms.mlp_in).weight.detach().clone()
             for i, b in enumerate(model.model.layers)}
    inputs = moe_inputs(model, torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(2)))  # held out
    routed = RoutedTokens()
    quantize(model, QuantConfig(**AWQ), calib(), routed=routed)
    quantize(rtn, QuantConfig(method="rtn", group_size=G))
    tokens = calib().numel()
    assert set(routed.counts) == set(moes)
    for name, fp in moes.items():
        counts = routed.counts[name]
        assert counts[planted] == 0 and counts.sum() == tokens * fp.top_k
        awq = model.get_submodule(name)
        for lin in (awq.experts[planted].get_submodule(n) for n in fp.experts[planted].names):
            assert isinstance(lin, PackedLinear)
            assert torch.isfinite(lin.weight_scale).all() and (lin.weight_scale > 0).all()
        layer = name.rsplit(".", 1)[0]  # the scale AWQ folded into the norm before the experts divides their input
        s = norms[layer] / model.get_submodule(f"{layer}.{model.cfg.arch.norms.mlp_in}").weight  # [C]
        with torch.no_grad():
            x = inputs[name]  # [N, C]: the block's inputs, channel 0 a large positive constant, the rest small
            ref = fp(x)  # the routed output: AWQ keeps its lead over RTN (MSE 0.004-0.015 of RTN's measured)
            assert (awq(x / s) - ref).pow(2).mean() < 0.8 * (rtn.get_submodule(name)(x) - ref).pow(2).mean()
            x = x * torch.tensor([-1.0] + [1.0] * (x.shape[1] - 1))  # channel 0 negative: routed to the planted expert
            assert (fp.route(x)[1] == planted).any(-1).all()
            # On the inputs routed to it, the never-routed expert's int4 error is below plain rounding's: its grids and
            # GPTQ use the statistics of every token ("calibrate all experts"); 0.23-0.53 of RTN's error measured.
            want, got, plain = fp.experts[planted](x), awq.experts[planted](x / s), rounded(fp.experts[planted])(x)
            error = lambda y: ((y - want).norm() / want.norm()).item()  # noqa: E731
            assert error(got) <= error(plain) < 0.3
            # Inputs unlike anything calibration saw (every channel but 0 ~10x larger) cost every expert AWQ's lead, the
            # routed ones as much: AWQ/RTN 1.11-2.04 for those, 1.11-1.54 for the planted one, 0.55-0.95 of the worst.
            x = torch.randn(256, x.shape[1], generator=torch.Generator().manual_seed(3))
            x[:, 0] = -8.0
            ratios = [(awq.experts[e](x / s) - f(x)).norm() / (rounded(f)(x) - f(x)).norm() for e, f in enumerate(fp.experts)]
            assert ratios[planted] <= 1.05 * max(r for e, r in enumerate(ratios) if e != planted)


def test_routed_tokens_in_compress_json_and_printed(tmp_path, smollm2_dir, data_dir, capsys):
    from compress.commands.quantize import run_quantize

    src = save_hf(moe_hf("qwen2_moe", vocab=49152), tmp_path / "src", smollm2_dir)
    out = run_quantize(str(src), QuantConfig(calib_samples=4, calib_seq_len=32, **AWQ), str(tmp_path / "out"))
    counts = json.loads((out / "compress.json").read_text())["stats"]["routed_tokens"]
    assert list(counts) == ["model.layers.1.mlp"]  # layer 0 is dense (decoder_sparse_step 2)
    assert len(counts["model.layers.1.mlp"]) == 4 and sum(counts["model.layers.1.mlp"]) == 4 * 32 * 2
    assert "tokens routed per expert in calibration: min" in capsys.readouterr().out


def test_prune_distill_refuses_a_mixture_of_experts(tmp_path, monkeypatch, capsys):
    src = save_hf(moe_hf("mixtral"), tmp_path / "src")
    capsys.readouterr()
    code, _, err = run_main(monkeypatch, capsys, "prune-distill", str(src), "--target-params", "100K", "--no-distill",
                            "-o", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "mixture of experts" in err


def test_expert_tensor_missing_from_a_shard(tmp_path, monkeypatch, capsys):
    src = save_hf(moe_hf("qwen3_moe"), tmp_path / "src")
    state = load_file(src / "model.safetensors")
    del state["model.layers.1.mlp.experts.2.up_proj.weight"]
    save_file(state, src / "model.safetensors", metadata={"format": "pt"})
    capsys.readouterr()
    code, _, err = run_main(monkeypatch, capsys, "quantize", str(src), "--method", "rtn", "-o", str(tmp_path / "out"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "tensors missing" in err
