"""The one-call CPU decode step: the module path's numbers, and taken only where every op chose C."""

import pytest
import torch

from compress.kernels import (byte_q8_cpu, decode_step_cpu, linear_cpu, nibble_linear_cpu, nibble_q8_cpu, paged_attention_cpu,
                              rms_norm_cpu, rope_cpu)
from compress.runtime import SamplingParams, cpu_fusion, cpu_kernels
from compress.model.attention import AttentionSpec
from compress.runtime.attention import AttentionMetadata, PagedAttention
from compress.runtime.cpu_modules import NibbleLinear
from compress.runtime.cpu_step import DecodeStep, eligible
from compress.runtime.kernel_choice import C, TORCH
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import make_llm
from tests.runtime.test_cpu_kernels import FixedTimings

needs_kernels = pytest.mark.skipif(
    None in (decode_step_cpu.load(), linear_cpu.load(), nibble_linear_cpu.load(), paged_attention_cpu.load(), rms_norm_cpu.load(),
             rope_cpu.load()),
    reason="no C compiler builds the kernels here")


def engine(model_dir, monkeypatch, kernel=C, **config):
    monkeypatch.setattr(cpu_kernels, "Timings", lambda: FixedTimings(kernel))
    return make_llm(model_dir, max_num_seqs=4, max_num_batched_tokens=64, **config)


def prefill(runner, prompts: list[list[int]], tables: list[list[int]]) -> None:
    """Run the prompts through the module path, filling their K/V slots."""
    meta = AttentionMetadata.build([0] * len(prompts), [len(p) for p in prompts], tables, 16, "cpu")
    ids = torch.tensor([[t for p in prompts for t in p]])
    with torch.inference_mode():
        runner.model.hidden(ids, meta.positions[None], PagedAttention(runner.kv, meta))


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory, smollm2_dir):
    """A 2-layer random Qwen3 (q/k norms per head, head_dim 24 apart from hidden / heads) with SmolLM2's tokenizer."""
    return save_hf(tiny_hf("qwen3", vocab=49152, head_dim=24), tmp_path_factory.mktemp("qwen3") / "model", smollm2_dir)


@needs_kernels
@pytest.mark.parametrize("kind", ["int4", "int4 int8 activations", "int4 q/k/v apart", "fp32", "qwen3 fp32", "gguf Q4_K_M", "gguf Q4_0"])
def test_a_decode_step_gives_the_module_path_s_hidden_states_and_cache(tiny_dir, tiny_int4_dir, qwen3_dir, monkeypatch, kind,
                                                                       request):
    if "int8" in kind and nibble_q8_cpu.load() is None or "gguf" in kind and byte_q8_cpu.load() is None:
        pytest.skip("no int8-activation kernel here")
    # the GGUF: Linears of four block types, each with its own kernel (nibbles or bytes) and group size in one loop
    model_dir = {"fp32": tiny_dir, "qwen3 fp32": qwen3_dir}.get(kind) or (
        request.getfixturevalue(f"{kind.split()[1].lower()}_gguf")[1] if "gguf" in kind else tiny_int4_dir)
    if kind == "int4 q/k/v apart":  # three Linears a block (types that join no Linear): the loop's own q, k, v calls
        monkeypatch.setattr(cpu_fusion, "JOINS", [j for j in cpu_fusion.JOINS if j[0] != "qkv"])
    llm = engine(model_dir, monkeypatch, cpu_int8_activations="int8" in kind or "gguf" in kind)
    runner = llm.runner
    assert isinstance(runner.decode_step, DecodeStep)
    assert all((b.self_attn.qkv is None) == (kind == "int4 q/k/v apart") for b in runner.model.model.layers)
    if kind == "gguf Q4_0":  # fp16 scales and no offsets: the kernel's Q4_0 entry, in the step's table
        assert {m.form for m in runner.model.modules() if isinstance(m, NibbleLinear)} == {"fp16 symmetric"}
    prompts, tables = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 40))], [[3], [1, 7]]  # 7 and 20 tokens: one sequence over two blocks
    prefill(runner, prompts, tables)
    meta = AttentionMetadata.build([7, 20], [1, 1], tables, 16, "cpu")
    ids = torch.tensor([[42, 43]])
    assert runner.decode_step.takes(meta, 2, True, True)
    before = runner.kv.clone()
    h_step = runner.decode_step(ids, meta)
    kv_step, runner.kv[:] = runner.kv.clone(), before
    with torch.inference_mode():
        h_modules = runner.model.hidden(ids, meta.positions[None], PagedAttention(runner.kv, meta, AttentionSpec(), True, True))
    # block 0's rotated K and V: bit for bit, except Qwen3's q/k norms (the C norm sums in another order than torch's)
    exact = 1e-6 if kind.startswith("qwen3") else 0
    torch.testing.assert_close(kv_step[:, 0], runner.kv[:, 0], rtol=0, atol=exact)
    torch.testing.assert_close(kv_step, runner.kv, rtol=1e-5, atol=1e-6)  # later blocks: after SiLU(gate) * up, computed apart
    torch.testing.assert_close(h_step, h_modules, rtol=1e-5, atol=1e-5)
    assert not torch.equal(kv_step, before)


@needs_kernels
@pytest.mark.parametrize("kind", ["int4", "fp32"])
def test_the_engine_takes_it_for_decode_steps_only_and_generates_the_same_tokens(tiny_dir, tiny_int4_dir, monkeypatch, kind):
    llm = engine(tiny_dir if kind == "fp32" else tiny_int4_dir, monkeypatch)
    calls, real = [], DecodeStep.__call__
    monkeypatch.setattr(DecodeStep, "__call__", lambda self, ids, meta: calls.append(ids.shape[1]) or real(self, ids, meta))
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5], list(range(100, 130))]
    with_step = [o.token_ids for o in llm.generate(prompts, params)]
    assert calls and set(calls) <= {1, 2}  # decode steps of one or both sequences; the prompts went through the modules
    step, llm.runner.decode_step = llm.runner.decode_step, None
    assert [o.token_ids for o in llm.generate(prompts, params)] == with_step
    llm.runner.decode_step = step


@needs_kernels
def test_not_taken_where_an_op_chose_torch(tiny_int4_dir, monkeypatch):
    llm = engine(tiny_int4_dir, monkeypatch)
    step = llm.runner.decode_step
    meta = AttentionMetadata.build([7], [1], [[3]], 16, "cpu")
    assert step.takes(meta, 1, True, True)
    assert not step.takes(meta, 1, False, True) and not step.takes(meta, 1, True, False)  # attention, rope
    # o_proj's plan (one table its group shares): its C kernel more than FUSE_MARGIN behind at 1 row
    llm.runner.model.model.layers[0].self_attn.o_proj.fuse_c[:] = [False, False, True]
    assert not step.takes(meta, 1, True, True)
    assert not step.takes(AttentionMetadata.build([0], [20], [[3, 4]], 16, "cpu"), 20, True, True)  # a prompt


@needs_kernels
def test_models_it_does_not_run(tiny_dir, tiny_int4_dir, monkeypatch):
    assert engine(tiny_int4_dir, monkeypatch, kernel=TORCH).runner.decode_step is not None  # eligible; plans decide per step
    llm = engine(tiny_int4_dir, monkeypatch)
    llm.runner.model.model.layers[1].mlp.down_proj.bias = torch.nn.Parameter(torch.zeros(64), requires_grad=False)
    assert not eligible(llm.runner.model)
    fp32 = engine(tiny_dir, monkeypatch).runner.model
    assert eligible(fp32)
    fp32.model.layers[0].self_attn.o_proj = llm.runner.model.model.layers[0].self_attn.o_proj  # an int4 Linear among fp32 ones
    assert not eligible(fp32)
    monkeypatch.setattr(decode_step_cpu, "load", lambda: None)
    assert not eligible(engine(tiny_int4_dir, monkeypatch).runner.model)  # no compiler: the module path
