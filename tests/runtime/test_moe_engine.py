"""Mixtures of experts through the engine (CPU, fp32 and int4): greedy tokens equal transformers' generate with the
paged cache, prefix sharing, chunked prefill and a batch whose tokens route to different experts; every expert's
Linears run the C-kernel modules (one timing group per shape, each expert's gate/up joined); a step runs each chosen
expert once over its tokens, and at batch 1 only the top-k experts of each sparse layer."""

from collections import Counter

import pytest
import torch

from compress.kernels import linear_cpu, nibble_linear_cpu
from compress.models import load_model
from compress.quant.apply import quantize
from compress.quant.config import QuantConfig
from compress.quant.export import write_quantized
from compress.runtime import SamplingParams
from compress.runtime.cpu_modules import CpuLinear, NibbleLinear
from compress.runtime.cpu_step import eligible, simple_layers
from tests.conftest import save_hf, tiny_hf
from tests.families import MOE_FAMILIES
from tests.runtime.conftest import hf_greedy, make_llm, random_prompts

PARAMS = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


def sparse_blocks(model) -> dict[int, torch.nn.Module]:
    """Layer -> its MoE block."""
    return {i: b.get_submodule(b.ffn) for i, b in enumerate(model.model.layers) if model.cfg.is_moe(i)}


def count_expert_calls(model) -> Counter:
    """A Counter of (layer, expert) calls, kept up to date by forward hooks on every routed expert."""
    calls = Counter()
    for layer, moe in sparse_blocks(model).items():
        for e, expert in enumerate(moe.experts):
            expert.register_forward_hook(lambda m, args, out, key=(layer, e): calls.update([key]))
    return calls


def step(llm, calls: Counter, done: dict) -> Counter:
    """One engine step: its finished sequences' tokens into done, and the expert calls it made."""
    calls.clear()
    done.update((o.request_id, o.token_ids) for o in llm.step() if o.finished)
    return Counter(calls)


def run_all(llm, prompts: list[list[int]], calls: Counter) -> tuple[list[list[int]], list[Counter]]:
    """Greedy tokens of every prompt (the first one's first chunk prefilled alone, registering the shared prefix
    before the others arrive), and the expert calls of every step."""
    done = {}
    first = llm.add_request(prompts[0], PARAMS)
    steps = [step(llm, calls, done)]
    rest = [llm.add_request(p, PARAMS) for p in prompts[1:]]
    while llm.has_unfinished():
        steps.append(step(llm, calls, done))
    return [done[i] for i in [first, *rest]], steps


@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_moe_greedy_equals_transformers(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, **MOE_FAMILIES[kind])
    llm = make_llm(save_hf(hf, tmp_path / kind, smollm2_dir), max_num_batched_tokens=24)  # chunked prefill
    prefix, a, b, c = random_prompts([20, 5, 9, 30], 256, seed=21)
    prompts = [prefix + a, prefix + b, c]  # two share 20 prefix tokens (one full block of 16)
    calls = count_expert_calls(llm.runner.model)
    tokens, steps = run_all(llm, prompts, calls)
    assert tokens == [hf_greedy(hf, p, PARAMS.max_tokens) for p in prompts]
    assert llm.blocks.num_prefix_hits >= 1
    assert all(n == 1 for step in steps for n in step.values())  # each chosen expert once a step, over all its tokens
    top_k, layers = llm.runner.model.cfg.moe.top_k, len(sparse_blocks(llm.runner.model))
    assert max(len(step) for step in steps) > top_k * layers  # the batch's tokens chose different experts


@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_batch_one_decode_step_runs_only_top_k_experts(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, **MOE_FAMILIES[kind])
    llm = make_llm(save_hf(hf, tmp_path / kind, smollm2_dir))
    model = llm.runner.model
    calls = count_expert_calls(model)
    llm.add_request(random_prompts([12], 256, seed=5)[0], PARAMS)
    llm.step()  # the prompt, routed to many experts
    for _ in range(3):
        calls.clear()
        llm.step()  # one decode row
        per_layer = Counter(layer for layer, _ in calls)
        assert per_layer == {layer: model.cfg.moe.top_k for layer in sparse_blocks(model)}
        assert set(calls.values()) == {1}


@pytest.mark.skipif(linear_cpu.load() is None, reason="no C compiler builds the kernel here")
@pytest.mark.parametrize("kind", MOE_FAMILIES)
def test_experts_run_cpu_linears_grouped_by_shape_and_joined(tmp_path, smollm2_dir, kind):
    hf = tiny_hf(kind, **MOE_FAMILIES[kind])
    llm = make_llm(save_hf(hf, tmp_path / kind, smollm2_dir))
    model, kernels = llm.runner.model, llm.runner.cpu_kernels
    experts = [e for moe in sparse_blocks(model).values() for e in moe.experts]
    assert all(isinstance(e.gate_up, CpuLinear) and isinstance(getattr(e, e.names[2]), CpuLinear) for e in experts)
    assert not any(hasattr(e, n) for e in experts for n in e.names[:2])  # gate and up joined into gate_up
    ops = [g.op for g in kernels.linears.groups]
    assert len(ops) == len(set(ops))  # one timing group per shape: the experts share theirs
    down = next(g for g in kernels.linears.groups if experts[0].get_submodule(experts[0].names[2]) in g.modules)
    assert len(down.modules) >= len(experts)
    assert not simple_layers(model.cfg) and not eligible(model) and llm.runner.decode_step is None


@pytest.mark.skipif(nibble_linear_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_int4_moe_export_loads_packed_experts_and_decodes_as_the_model(tmp_path, smollm2_dir):
    hf = tiny_hf("qwen3_moe", **MOE_FAMILIES["qwen3_moe"] | {"moe_intermediate_size": 64})  # groups of 32 divide every width
    src = save_hf(hf, tmp_path / "src", smollm2_dir)
    model = load_model(src)
    spec = quantize(model, QuantConfig(method="rtn", bits=4, group_size=32))
    (tmp_path / "rtn").mkdir()
    write_quantized(model, spec, tmp_path / "rtn", src)
    reference = load_model(tmp_path / "rtn")
    prompts = random_prompts([14, 9], 256, seed=8)
    expected = []
    with torch.no_grad():
        for p in prompts:
            ids = list(p)
            for _ in range(PARAMS.max_tokens):
                ids.append(int(reference(torch.tensor([ids]))[0, -1].argmax()))
            expected.append(ids[len(p):])
    llm = make_llm(tmp_path / "rtn")
    experts = [e for moe in sparse_blocks(llm.runner.model).values() for e in moe.experts]
    assert all(isinstance(e.gate_up, NibbleLinear) and isinstance(e.down_proj, NibbleLinear) for e in experts)
    assert [o.token_ids for o in llm.generate(prompts, PARAMS)] == expected
