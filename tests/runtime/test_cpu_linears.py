"""The CPU path's lossy options: an int8 lm_head (``cpu_lm_head="int8"``) and int4 Linears on int8
activations (``cpu_int8_activations``), as swapped by cpu_linears and as EngineConfig accepts them."""

import pytest
import torch

from compress.errors import UserError
from compress.kernels import int8_rows_cpu, nibble_linear_cpu, nibble_panel_cpu, nibble_q8_cpu, reference
from compress.models import load_model
from compress.runtime.config import EngineConfig
from compress.quant.linear import GgufLinear
from compress.runtime.cpu_linears import cpu_linears, op_of, swap_gguf
from compress.runtime.cpu_modules import ByteLinear, FiveLinear, Int8Linear, NibbleLinear, Scratch, SixLinear
from tests.runtime.test_model_runner import quantized_dir, set_kernel


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.skipif(int8_rows_cpu.load() is None, reason="no C compiler builds the kernel here")
def test_int8_lm_head_holds_int8_and_keeps_the_tied_table(tiny_dir):
    model = load_model(tiny_dir)
    table = model.model.embed_tokens.weight
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        swapped = cpu_linears(model, lm_head="int8")
        head = model.lm_head
        assert isinstance(head, Int8Linear) and head.codes.dtype == torch.int8 and head.codes.shape == table.shape
        assert model.model.embed_tokens.weight is table  # the lookup keeps its fp32 table
        assert "linear 49152x64 int8 rows" in [g.op for g in swapped.groups]
        head.use_c = [True]
        after_c = model(ids)
        head.use_c = [False]
        after_torch = model(ids)
    assert head.scratch.buffer.numel() == table.numel()  # torch's path: the dequantized table, in the shared scratch
    torch.testing.assert_close(after_c, after_torch, atol=1e-5, rtol=1e-5)  # one weight, two kernels
    assert 1e-5 < relative_error(after_c, before) < 0.01  # int8 per row: below 1 % on the logits
    assert (after_c.argmax(-1) == before.argmax(-1)).float().mean() > 0.9


@pytest.mark.skipif(nibble_q8_cpu.load() is None, reason="no AVX2 or C compiler for the kernel here")
def test_int8_activations_run_the_integer_kernel_on_int4_linears(tmp_path, smollm2_dir, monkeypatch):
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))  # hidden 64: groups of 64
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        before = model(ids)
        swapped = cpu_linears(model, int8_activations=True)
        nibbles = [m for m in model.modules() if isinstance(m, NibbleLinear)]
        assert len(nibbles) == 2 * 7 and all(m.int8_activations for m in nibbles)
        assert all("int8 activations" in g.op for g in swapped.groups if isinstance(g.modules[0], NibbleLinear))
        calls = []
        real = nibble_q8_cpu.unchecked
        monkeypatch.setattr(nibble_q8_cpu, "unchecked", lambda *a: calls.append(a) or real(*a))
        set_kernel(model, True)
        after = model(ids)
    assert len(calls) == 2 * 7
    assert 1e-5 < relative_error(after, before) < 0.05


def test_int8_activations_leave_linears_the_kernel_cannot_run(tmp_path, smollm2_dir, monkeypatch):
    monkeypatch.setattr(nibble_q8_cpu, "supports", lambda scale, in_features: False)
    model = load_model(quantized_dir(tmp_path, smollm2_dir, "rtn"))
    cpu_linears(model, int8_activations=True)
    assert not any(m.int8_activations for m in model.modules() if isinstance(m, NibbleLinear))


def test_engine_config_checks_the_cpu_options():
    assert EngineConfig(device="cpu", cpu_lm_head="int8", cpu_int8_activations=True).cpu_lm_head == "int8"
    with pytest.raises(UserError, match="cpu_lm_head must be one of auto, stored, int8"):
        EngineConfig(device="cpu", cpu_lm_head="int4")
    with pytest.raises(UserError, match="apply to the CPU runtime"):
        EngineConfig(device="cuda", cpu_int8_activations=True)


@pytest.mark.skipif(nibble_q8_cpu.load() is None or nibble_panel_cpu.load() is None, reason="no kernels here")
def test_a_compact_int4_linear_gives_the_wide_one_s_outputs_on_every_path():
    """fp16 scales and no offsets (a Q4_0): the C kernel reads them as they are, the panel GEMM and torch's path widen
    them per call; all three as for the same weight held with fp32 scales and offsets."""
    codes = torch.randint(0, 16, (48, 128), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    scale = (torch.rand(48, 4) + 0.5).half().float()
    packed = dict(zip(NibbleLinear.NAMES, nibble_linear_cpu.pack(codes, scale, torch.full((48, 4), 8, dtype=torch.int32))))
    small, wide = NibbleLinear(packed, None, Scratch(), True), NibbleLinear(packed, None, Scratch(), False)
    assert small.form == "fp16 symmetric" and small.scales.dtype == torch.float16 and wide.form == "fp32"
    x = torch.randn(30, 128)
    for use_c, use_panel in [(True, False), (False, True), (False, False)]:
        small.use_c, small.use_panel, wide.use_c, wide.use_panel = [use_c], [use_panel], [use_c], [use_panel]
        # the C path rounds x to int8 as ggml does for a Q4_0 (fp16 steps per 32; the wide module's fp32 kernel does not)
        weight = nibble_linear_cpu.dequantize(tuple(packed.values())).double()
        expected = (reference.round_blocks_int8(x, 32, "fp16").double() @ weight.T).float() if use_c else wide(x)
        torch.testing.assert_close(small(x), expected, rtol=1e-5, atol=1e-5)


def q5_0_linear(out_features: int, in_features: int, seed: int = 0) -> GgufLinear:
    """A GGUF read's Q5_0 Linear: signed codes q - 16 and fp16 scales of either sign."""
    g = torch.Generator().manual_seed(seed)
    m = GgufLinear(in_features, out_features, "Q5_0", bias=False)
    m.weight_codes.copy_(torch.randint(-16, 16, (out_features, in_features), generator=g))
    m.weight_scale.copy_((torch.randn(out_features, in_features // 32, generator=g) * 0.02).half().float())
    return m


@pytest.mark.skipif(nibble_q8_cpu.load() is None, reason="no int8-activation kernel here")
def test_q5_0_is_held_in_its_own_5_5_bits_and_computes_as_the_byte_form():
    m = q5_0_linear(40, 128)
    five, wide = swap_gguf(m, Scratch(), True), swap_gguf(q5_0_linear(8, 96), Scratch(), True)
    assert isinstance(five, FiveLinear) and op_of(five) == "linear 40x128 5-bit g32 int8 activations fp16 scales"
    assert sum(t.nbytes for t in five.packed) * 8 / m.weight_codes.numel() == 5.5
    assert isinstance(wide, ByteLinear)  # 96 inputs: not whole loads of 64, a byte a code
    x = torch.randn(6, 128)
    as_bytes = five.as_bytes()
    assert torch.equal(as_bytes.row_major()["codes"], m.weight_codes) and torch.equal(as_bytes.scales, m.weight_scale)
    torch.testing.assert_close(five(x), as_bytes(x), rtol=1e-5, atol=1e-5)  # the same integer products
    five.use_c = [False]  # torch's path: the dequantized weight, x not rounded
    torch.testing.assert_close(five(x), x @ m.dequantized().T, rtol=1e-5, atol=1e-5)
    assert relative_error(as_bytes(x), x @ m.dequantized().T) < 0.02


def q6_k_linear(out_features: int, in_features: int, seed: int = 0) -> GgufLinear:
    """A GGUF read's Q6_K Linear: signed codes q - 32 and d * sc per 16 (d fp16, sc int8)."""
    g = torch.Generator().manual_seed(seed)
    m = GgufLinear(in_features, out_features, "Q6_K", bias=False)
    m.weight_codes.copy_(torch.randint(-32, 32, (out_features, in_features), generator=g))
    d = (torch.randn(out_features, in_features // 256, 1, generator=g) * 0.001).half().float()
    m.weight_scale.copy_((d * torch.randint(-128, 128, (out_features, in_features // 256, 16), generator=g)).view(out_features, -1))
    return m


@pytest.mark.skipif(nibble_q8_cpu.load() is None, reason="no int8-activation kernel here")
def test_q6_k_is_held_in_its_own_bits_and_computes_as_the_byte_form():
    m = q6_k_linear(40, 512)
    held = swap_gguf(m, Scratch(), True)
    assert isinstance(held, SixLinear) and op_of(held) == "linear 40x512 6-bit g16 int8 activations super-block scales"
    assert sum(t.nbytes for t in held.packed) * 8 / m.weight_codes.numel() == 6.625  # from 10 as bytes
    m.weight_scale[3, 5] += 1e-3  # a super-block that is no unit times int8s: a byte a code
    assert isinstance(swap_gguf(m, Scratch(), True), ByteLinear)
    m = q6_k_linear(40, 512)
    as_bytes = ByteLinear({"codes": m.weight_codes.clone(), "scales": m.weight_scale.clone()}, None, Scratch())
    x = torch.randn(6, 512)
    torch.testing.assert_close(held(x), as_bytes(x), rtol=1e-5, atol=1e-5)  # the same integer products
    held.use_c = [False]  # torch's path: the dequantized weight, x not rounded
    torch.testing.assert_close(held(x), x @ m.dequantized().T, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(nibble_q8_cpu.load() is None or int8_rows_cpu.load() is None, reason="no int8 kernels here")
def test_a_gguf_output_layer_runs_its_codes_where_they_are_fewer_bytes_than_int8_rows():
    q8_0 = GgufLinear(512, 64, "Q8_0", bias=False)
    q8_0.weight_codes.copy_(torch.randint(-127, 128, (64, 512), generator=torch.Generator().manual_seed(0)))
    q8_0.weight_scale.copy_(torch.rand(64, 16) * 0.01)
    for head, held in ((q6_k_linear(64, 512), SixLinear), (q8_0, Int8Linear)):  # 6.625 bits; 9 bits as codes, 8 as rows
        model = torch.nn.Module()
        model.lm_head = head
        cpu_linears(model, "int8", int8_activations=True)
        assert isinstance(model.lm_head, held)
