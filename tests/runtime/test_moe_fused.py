"""The fused-MoE path (runtime/fused_experts.py) against the per-expert path, with the Triton kernel run under the
interpreter on CPU (``DEVICES`` gains "cpu"): a block of each family's tiny int4 RTN model gives the per-expert
output within the kernel tests' fp32 bound, the stacks are the experts' own bytes (no second copy), and an engine
run as on CUDA (no CPU kernel swap) gives the same greedy tokens fused and per expert."""

import pytest
import torch

from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from compress.model.moe import SparseMoe
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.runtime import SamplingParams, fused_experts, model_runner
from compress.runtime.fused_experts import FusedExperts, fusable, fuse_experts
from tests.conftest import save_hf, tiny_hf
from tests.families import MOE_FAMILIES
from tests.kernels.tolerance import RELATIVE
from tests.runtime.conftest import make_llm, random_prompts

# The largest group that divides every quantized width (hidden 64; experts 64 (Mixtral, here) or 48, Qwen2-MoE's
# shared expert 80): the interpreter's time goes with the tiles, and a K tile is as wide as the group (at most 64).
GROUPS = {"mixtral": 64, "qwen2_moe": 16, "qwen3_moe": 16}


def tiny_moe(kind: str):
    return tiny_hf(kind, **MOE_FAMILIES[kind] | ({"intermediate_size": 64} if kind == "mixtral" else {}))


@pytest.fixture
def on_cpu(monkeypatch):
    """The fused path on CPU tensors (the Triton kernel under the interpreter)."""
    monkeypatch.setattr(fused_experts, "DEVICES", {"cuda", "cpu"})


def int4_model(kind: str, symmetric: bool):
    hf = tiny_moe(kind)
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
    fmt = "compressed-tensors" if symmetric else "awq"  # a MoE model's int4 is symmetric for compressed-tensors
    quantize(model, QuantConfig(method="rtn", bits=4, group_size=GROUPS[kind], format=fmt))
    return model


def blocks(model) -> list[SparseMoe]:
    return [m for m in model.modules() if isinstance(m, SparseMoe)]


def storage_bytes(model) -> int:
    """Bytes of the distinct storages behind model's buffers and parameters."""
    tensors = [*model.buffers(), *model.parameters()]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_fused_block_matches_per_expert_and_keeps_one_copy(kind, symmetric, on_cpu):
    model = int4_model(kind, symmetric)
    x = torch.randn(2, 9, model.cfg.hidden_size, generator=torch.Generator().manual_seed(1))  # [B, T, C]: 36 (token, k) slots
    with torch.no_grad():
        expected = [b(x) for b in blocks(model)]
        before = storage_bytes(model)
        fused = fuse_experts(model)
        assert len(fused) == len(blocks(model)) and storage_bytes(model) == before  # the stacks are the experts' bytes
        for block, want in zip(blocks(model), expected):
            names = block.experts[0].names
            assert all(getattr(e, n).weight_packed.untyped_storage().data_ptr() ==
                       block.fused.gate_up[0].untyped_storage().data_ptr() for e in block.experts for n in names[:2])
            got = block(x)
            # max |fused - per expert| / max |out|: at most 5.4e-7 measured (fp32, every family, both zero-point kinds, 3 inputs)
            assert (got - want).abs().max() <= RELATIVE[torch.float32] * want.abs().max()
            block.fused = None
            assert torch.equal(block(x), want)  # the per-expert path reads the same bytes through the views


def test_only_int4_packed_experts_on_a_fused_device_are_fused(monkeypatch):
    int4 = int4_model("qwen3_moe", True)
    assert not fusable(blocks(int4)[0])  # CPU tensors, and DEVICES is CUDA only
    monkeypatch.setattr(fused_experts, "DEVICES", {"cuda", "cpu"})
    assert fusable(blocks(int4)[0])
    hf = tiny_hf("qwen3_moe", **MOE_FAMILIES["qwen3_moe"])
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict()))
    assert not fusable(blocks(model)[0])  # fp32 Linears
    quantize(model, QuantConfig(method="rtn", bits=3, group_size=16))
    assert fuse_experts(model) == [] and blocks(model)[0].fused is None  # int3


@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_engine_greedy_fused_equals_per_expert(tmp_path, smollm2_dir, kind, on_cpu, monkeypatch):
    monkeypatch.setattr(model_runner, "choose", lambda model, config: None)  # CUDA's path: no CPU kernel swap
    hf = tiny_moe(kind)
    src = save_hf(hf, tmp_path / "src", smollm2_dir)
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
    spec = quantize(model, QuantConfig(method="rtn", bits=4, group_size=GROUPS[kind]))
    (tmp_path / "rtn").mkdir()
    write_quantized(model, spec, tmp_path / "rtn", src)
    llm = make_llm(tmp_path / "rtn", enable_prefix_caching=False)
    moes = blocks(llm.runner.model)
    assert len(llm.runner.fused_experts) == len(moes) and all(isinstance(b.fused, FusedExperts) for b in moes)
    calls = []
    for b in moes:
        b.fused = lambda *a, f=b.fused: calls.append(1) or f(*a)
    prompts = random_prompts([11, 4, 19], 256, seed=3)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    fused = [o.token_ids for o in llm.generate(prompts, params)]
    assert calls
    for b in moes:
        b.fused = None
    assert fused == [o.token_ids for o in llm.generate(prompts, params)]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_int4_experts_on_cuda_are_fused_by_default_and_match(kind):
    model = int4_model(kind, True).cuda()
    x = torch.randn(2, 9, model.cfg.hidden_size, device="cuda")
    with torch.no_grad():
        expected = [b(x) for b in blocks(model)]  # per expert: dequant_matmul per chosen expert's gate, up, down
        assert len(fuse_experts(model)) == len(blocks(model))  # DEVICES as shipped
        for block, want in zip(blocks(model), expected):
            assert (block(x) - want).abs().max() <= RELATIVE[torch.float32] * want.abs().max()
