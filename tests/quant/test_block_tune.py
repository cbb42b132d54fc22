"""Block-output tuning (quant/block_tune.py): it starts from the codes it is given, moves each code at most one step,
brings the block's output closer to the unquantized block's, in ``quantize`` fits the unquantized model's own
outputs block after block, and reaches routed experts."""

import copy

import pytest
import torch

from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from compress.quant.apply import quantize
from compress import host
from compress.quant.block_tune import Rounding, batches, step_dtype, tune_block
from compress.quant.config import QuantConfig
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec, dequantize, qparams
from compress.quant.primitives import quantize as round_codes
from compress.quant.swap import quantize_block
from tests.quant.test_awq import output_mse, planted_model
from tests.quant.test_moe_quant import moe_hf

SPEC = IntSpec(4, 32)


def test_a_zero_offset_gives_back_the_codes_it_started_from():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(48, 64, generator=gen)
    scale, zero = qparams(w, SPEC)
    moved = torch.randint(-1, 2, w.shape, generator=gen)  # GPTQ moves codes off nearest rounding
    codes = (round_codes(w, scale, zero, SPEC).int() + moved).clamp(0, SPEC.qmax).to(torch.uint8)
    r = Rounding.on_int_grid(w, scale, zero, codes, SPEC)
    offset = torch.zeros(w.shape)
    assert torch.equal(r.codes(offset).flatten(1).to(torch.uint8), codes)
    torch.testing.assert_close(r.weight(offset)[0], dequantize(codes, scale, zero, SPEC.group_size), rtol=0, atol=1e-6)  # q a + b
    assert torch.equal(r.codes(torch.full(w.shape, 0.49)).flatten(1) - codes, (r.codes(torch.full(w.shape, 0.49)).flatten(1) - codes).clamp(0, 1))


def test_any_grid_q_a_plus_b_starts_from_its_codes():
    """GGUF grids (compress/gguf/rounding.py) have offsets b off the step's multiples, and a = 0 where a group is flat."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(16, 64, generator=gen)
    a, b = torch.rand(16, 2, generator=gen) * 0.5, torch.randn(16, 2, generator=gen)  # [O, G]
    a[0, 1] = 0
    codes = torch.randint(0, 16, w.shape, generator=gen, dtype=torch.uint8)
    r = Rounding.start(w, a, b, codes, 15)
    offset = torch.zeros(w.shape)
    assert torch.equal(r.codes(offset).flatten(1).to(torch.uint8), codes)
    want = codes.float().view(16, 2, 32) * a[..., None] + b[..., None]
    assert torch.equal(r.weight(offset)[0], want.flatten(1))
    near = r.codes(torch.full(w.shape, 0.49)).flatten(1) - r.codes(torch.full(w.shape, -0.49)).flatten(1)
    assert near[1:].max() == 1 and near[0, 32:].max() == 1  # half a step either way moves a code by at most one


def test_the_step_is_the_sign_of_the_straight_through_gradient():
    """descend differentiates the block in the dequantized weight; straight through the rounding, the offset's own
    gradient has the same sign where the clamp lets the code move, and is zero where it holds it."""
    gen = torch.Generator().manual_seed(5)
    w, x = torch.randn(24, 64, generator=gen), torch.randn(10, 64, generator=gen)
    scale, zero = qparams(w, SPEC)
    codes = (round_codes(w, scale, zero, SPEC).int() + torch.randint(-2, 3, w.shape, generator=gen)).clamp(0, SPEC.qmax)
    r = Rounding.on_int_grid(w, scale, zero, codes.to(torch.uint8), SPEC)
    offset = (torch.rand(w.shape, generator=gen) - 0.5).requires_grad_(True)
    u = r.w + offset.view_as(r.w)
    q = (u + (torch.round(u) - u).detach() + r.base).clamp(0, SPEC.qmax)  # straight-through rounding
    ((x @ ((q - zero[..., None]) * scale[..., None]).flatten(1).T).sin().sum()).backward()
    weight, moves = r.weight(offset.detach())
    weight.requires_grad_(True)
    (x @ weight.T).sin().sum().backward()
    assert 0 < moves.float().mean() < 1  # some codes sit outside [0, qmax] before the clamp
    assert torch.equal(offset.grad.sign(), weight.grad.sign() * moves)


def test_the_steps_run_in_bf16_where_the_cpu_multiplies_it_natively(monkeypatch):
    cpu = torch.device("cpu")
    assert step_dtype(cpu, "float32") == torch.float32 and step_dtype(cpu, "bfloat16") == torch.bfloat16
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "avx512f", "avx512_bf16"})
    assert step_dtype(cpu, None) == torch.bfloat16
    monkeypatch.setattr(host, "cpu_flags", lambda: {"avx2", "fma"})
    assert step_dtype(cpu, None) == torch.float32


def test_batches_are_seeded_permutations_of_the_rows():
    steps = batches(20, 5, seed=3)
    assert [len(b) for b in steps] == [8] * 5
    assert len(set(steps[0].tolist()) | set(steps[1].tolist())) == 16  # one permutation gives two disjoint batches
    assert all(torch.equal(a, b) for a, b in zip(steps, batches(20, 5, seed=3)))
    assert not torch.equal(steps[0], batches(20, 5, seed=4)[0])
    assert [len(b) for b in batches(3, 4, seed=0)] == [3] * 4


def block_and_inputs():
    model = planted_model()
    ids = torch.randint(0, 256, (16, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.embed(ids)  # [N, T, C]
        model.prepare(torch.arange(ids.shape[1])[None], x.dtype)
        block = model.model.layers[0]
        return block, x, block(x)


def block_error(block, x, target) -> float:
    with torch.no_grad():
        return (block(x) - target).pow(2).mean().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tuning_moves_codes_one_step_at_most_and_fits_the_block_output(dtype):
    block, x, target = block_and_inputs()
    params = {name: qparams(block.get_submodule(name).weight, SPEC) for name in block.linears}
    start = {name: round_codes(block.get_submodule(name).weight, *params[name], SPEC) for name in block.linears}
    tuned_params, codes = tune_block(block, x, target, params, start, SPEC, iters=60, seed=0, dtype=dtype)
    assert all(torch.equal(tuned_params[n][0], params[n][0]) for n in params)  # the grids stay
    steps = torch.cat([(codes[n].int() - start[n].int()).flatten() for n in start])
    assert steps.abs().max() == 1 and (steps != 0).float().mean() > 0.01
    rtn, tuned = copy.deepcopy(block), block
    quantize_block(rtn, SPEC, params, start)
    quantize_block(tuned, SPEC, tuned_params, codes)
    assert block_error(tuned, x, target) < 0.8 * block_error(rtn, x, target)


def test_quantize_with_tuning_fits_the_model_output_better_than_awq_alone():
    calib = torch.randint(0, 256, (16, 32), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = planted_model()(calib)
    cfg = dict(method="awq", bits=3, group_size=32, search_sequences=4, search_tokens=256)
    awq, tuned = planted_model(), planted_model()
    quantize(awq, QuantConfig(**cfg), calib=calib)
    quantize(tuned, QuantConfig(**cfg, tune_iters=40, tune_dtype="float32"), calib=calib)
    assert output_mse(tuned, ref, calib) < 0.9 * output_mse(awq, ref, calib)


@pytest.mark.parametrize("kw, words", [
    (dict(method="rtn", tune_iters=10), "applies to --method awq"),
    (dict(method="rtn", format="gguf", tune_iters=10), "applies to --method awq"),
    (dict(method="awq", tune_iters=-1), "must be >= 0"),
    (dict(method="awq", tune_dtype="bfloat16"), "give --tune-iters N too"),
    (dict(method="awq", tune_iters=10, tune_dtype="float16"), "is not one of float32, bfloat16"),
])
def test_tune_iters_outside_awq_is_refused(kw, words):
    with pytest.raises(UserError, match=words):
        QuantConfig(**kw)


def test_tuning_moves_the_codes_of_routed_experts_too():
    hf = moe_hf("qwen2_moe")
    calib = torch.randint(0, 256, (16, 32), generator=torch.Generator().manual_seed(3))
    made = []
    for tune in (0, 20):
        model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
        quantize(model, QuantConfig(method="awq", group_size=16, search_sequences=2, search_tokens=128, tune_iters=tune), calib=calib)
        made.append({n: m.codes()[0] for n, m in model.named_modules() if isinstance(m, PackedLinear)})
    experts = [n for n in made[0] if ".experts." in n]
    assert experts and made[0].keys() == made[1].keys()
    assert sum(not torch.equal(made[0][n], made[1][n]) for n in experts) > len(experts) // 2
