"""The engine runs the kernels its plans choose, says what it chose, and times like work with each candidate."""

import pytest
import torch

from compress.kernels import linear_cpu, nibble_linear_cpu, nibble_panel_cpu, paged_attention_cpu, panel_cpu, rms_norm_cpu, rope_cpu
from compress.model.config import ModelConfig
from compress.runtime import SamplingParams, cpu_kernels, linear_timing, model_runner
from compress.runtime.cpu_linears import Group
from compress.runtime.cpu_modules import CpuLinear, NibbleLinear, Scratch
from compress.runtime.linear_timing import candidates, rotation
from compress.runtime.kernel_choice import C, PANEL, TORCH, Plan, buckets
from tests.runtime.conftest import make_llm

needs_kernels = pytest.mark.skipif(None in (linear_cpu.load(), nibble_linear_cpu.load(), paged_attention_cpu.load(), rms_norm_cpu.load(),
                                                   rope_cpu.load()),
                                   reason="no C compiler builds the kernels here")


class FixedTimings:
    """Stands in for kernel_choice.Timings: every op gets `kernel` at every bucket, and records what it was asked."""

    def __init__(self, kernel: str):
        self.kernel, self.requests, self.measured, self.skipped = kernel, [], 0, 0

    def request(self, op, max_rows, preferred, measure):
        self.requests.append((op, max_rows, preferred))

    def plans(self):
        return {op: Plan(tuple(buckets(m)), (self.kernel,) * len(buckets(m)), (None,) * len(buckets(m))) for op, m, _ in self.requests}

    def save(self):
        pass


def count_calls(monkeypatch, module, name: str) -> list:
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(a) or real(*a, **k))
    return calls


@needs_kernels
@pytest.mark.parametrize("kernel", [C, TORCH])
def test_the_engine_runs_the_chosen_kernels(tiny_dir, monkeypatch, capsys, kernel):
    timings = FixedTimings(kernel)
    monkeypatch.setattr(cpu_kernels, "Timings", lambda: timings)
    monkeypatch.setattr(model_runner, "eligible", lambda model: False)  # the whole-step C loop calls them unseen (test_cpu_step)
    llm = make_llm(tiny_dir, max_num_seqs=8, max_num_batched_tokens=64)
    err = capsys.readouterr().err
    gemm, attention = count_calls(monkeypatch, linear_cpu, "unchecked"), count_calls(monkeypatch, paged_attention_cpu, "unchecked")
    norm, rope = count_calls(monkeypatch, rms_norm_cpu, "rms_norm"), count_calls(monkeypatch, rope_cpu, "rope")
    llm.generate([[1, 2, 3], [4, 5]], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    assert {len(calls) > 0 for calls in (gemm, attention, norm, rope)} == {kernel == C}
    expected = "C at every row count" if kernel == C else "torch at every row count"
    assert f"runtime: linear 64x64 fp32 (2): {expected}" in err and f"runtime: decode attention: {expected}" in err  # o_proj
    assert f"runtime: rms_norm (5): {expected}" in err and f"runtime: rotary embedding: {expected}" in err  # 2 blocks + final
    assert f"runtime: linear 128x64 fp32 (2): {expected}" in err  # q, k and v joined (64 + 32 + 32 rows)
    ops = {op: (max_rows, preferred) for op, max_rows, preferred in timings.requests}
    assert ops["linear 49152x64 fp32"] == (64, TORCH)  # Linears: up to a step's tokens
    assert [v for op, v in ops.items() if op.startswith("attention")] == [(8, TORCH)]  # attention: up to max_num_seqs
    assert ops["rms_norm 64"] == (64, TORCH) and [v for op, v in ops.items() if op.startswith("rope")] == [(64, TORCH)]


@needs_kernels
def test_int4_models_prefer_the_4_bit_kernel_and_say_what_torch_s_path_holds(tiny_int4_dir, monkeypatch, capsys):
    timings = FixedTimings(TORCH)
    monkeypatch.setattr(cpu_kernels, "Timings", lambda: timings)
    llm = make_llm(tiny_int4_dir, max_num_batched_tokens=32)
    err = capsys.readouterr().err
    assert {p for op, _, p in timings.requests if "4-bit" in op} == {C}
    assert "runtime: Linears held in 4 or 8 bits dequantize into one 0.1 MiB scratch buffer where torch's GEMM runs them" in err
    assert llm.runner.cpu_kernels.linears.scratch_bytes() == 4 * 256 * 64  # gate and up joined: 256x64 fp32


def test_without_c_kernels_the_lines_say_torch_runs(tiny_dir, monkeypatch, capsys):
    monkeypatch.setattr(linear_cpu, "supports", lambda weight: False)
    monkeypatch.setattr(paged_attention_cpu, "supports", lambda t: False)
    llm = make_llm(tiny_dir)
    err = capsys.readouterr().err
    assert "runtime: matmuls run torch ops" in err and "runtime: decode attention: torch ops" in err
    assert llm.runner.cpu_kernels.attention is None and not llm.runner.cpu_kernels.attention_c(1)


def test_a_timing_pass_streams_distinct_weights_and_cuts_large_ones(monkeypatch):
    monkeypatch.setattr(linear_timing, "ROTATION_BYTES", 4 * 64 * 32 * 3)  # three 64x32 fp32 weights
    monkeypatch.setattr(linear_timing, "PASS_FLOPS", 2 * 64 * 32 * 8)  # 8 rows through one of them
    monkeypatch.setattr(linear_timing, "SLICE_MIN", 16)
    cut = lambda w, k: w[:k]  # noqa: E731
    weights = [torch.zeros(64, 32) for _ in range(5)]
    assert [w.shape[0] for w in rotation(weights, 64, 32, 1, cut)] == [64] * 3  # bytes bound: 3 of 5
    assert [w.shape[0] for w in rotation(weights, 64, 32, 8, cut)] == [64]  # work bound: one whole weight
    assert [w.shape[0] for w in rotation(weights, 64, 32, 16, cut)] == [32]  # half of one
    assert [w.shape[0] for w in rotation(weights, 64, 32, 512, cut)] == [16]  # never below SLICE_MIN


@needs_kernels
@pytest.mark.parametrize("rows", [1, 7])
def test_the_candidates_of_a_timing_do_the_same_work(rows, monkeypatch):
    g = torch.Generator().manual_seed(0)
    fp32 = Group([CpuLinear(torch.randn(48, 64, generator=g), None) for _ in range(2)])
    scale, zero = torch.rand(48, 2, generator=g), torch.randint(0, 16, (48, 2), generator=g)
    int4 = Group([NibbleLinear.from_codes(torch.randint(0, 16, (48, 64), generator=g, dtype=torch.uint8), scale, zero, None, Scratch())])
    for group, names in ((fp32, [C, TORCH, PANEL]), (int4, [C, TORCH, PANEL])):
        runs = candidates(group, rows)
        assert list(runs) == names
        ys = {name: fn() for name, fn in runs.items()}
        assert all(len(ys[name]) == len(group.modules) for name in names)
        for name in names[1:]:
            for a, b in zip(ys[C], ys[name]):
                torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    monkeypatch.setattr(panel_cpu, "load", lambda: None)
    monkeypatch.setattr(nibble_panel_cpu, "load", lambda: None)
    assert [list(candidates(group, rows)) for group in (fp32, int4)] == [[C, TORCH]] * 2  # no panel library: not offered
    cfg = ModelConfig("llama", 1, 4 * 16, 1, 1, 4, 2, 16)
    outs = {name: fn() for name, fn in cpu_kernels.decode_candidates(cfg, 16, rows).items()}
    torch.testing.assert_close(outs[C], outs[TORCH], atol=1e-5, rtol=1e-5)
