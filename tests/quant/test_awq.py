import pytest
import torch

from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from compress.quant import primitives
from compress.quant.apply import quantize
from compress.kernels import range_search_cpu, round_trip_cpu
from compress.quant import awq
from compress.quant.awq import candidate_scales, group_hessians, refit_scale, scaled_round_trip, search_qparams, weighted_error
from compress.quant.awq_apply import fold_scales, head_mapping
from compress.quant.config import QuantConfig
from compress.quant.linear import PackedLinear
from compress.quant.primitives import IntSpec, grouped, pseudo_quantize, qparams, range_qparams
from compress.quant.swap import layer_linears
from tests.conftest import tiny_hf

OUTLIERS = [3, 17, 40]


def planted_model(kind="llama", seed=0):
    """A tiny model whose norms make a few input channels 30x larger than the rest (as in real LLMs)."""
    hf = tiny_hf(kind, seed=seed, num_key_value_heads=2)
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict())).eval()
    with torch.no_grad():
        for block in model.model.layers:
            for norm, linears in ((block.input_layernorm, ("q_proj", "k_proj", "v_proj")), (block.post_attention_layernorm, ("gate_proj", "up_proj"))):
                norm.weight[OUTLIERS] *= 30
                parent = block.self_attn if linears[0] == "q_proj" else block.mlp
                for name in linears:  # same function, outliers now live in the activations
                    getattr(parent, name).weight[:, OUTLIERS] /= 30
    return model


def output_mse(model, ref_logits, ids):
    with torch.no_grad():
        return (model(ids) - ref_logits).pow(2).mean().item()


@pytest.mark.parametrize("rounding", ["gptq", "nearest"])
@pytest.mark.parametrize("bits", [3, 4])
def test_awq_beats_rtn_with_planted_outliers(bits, rounding):
    ids = torch.randint(0, 256, (8, 64))
    fp = planted_model()
    with torch.no_grad():
        ref = fp(ids)
    rtn, awq = planted_model(), planted_model()
    cfg = QuantConfig(method="awq", bits=bits, group_size=32, search_sequences=4, search_tokens=256, rounding=rounding)
    quantize(rtn, QuantConfig(method="rtn", bits=bits, group_size=32))
    quantize(awq, cfg, calib=torch.randint(0, 256, (8, 64)))
    assert all(isinstance(m, PackedLinear) for b in awq.model.layers for m in layer_linears(b).values())
    assert output_mse(awq, ref, ids) < 0.8 * output_mse(rtn, ref, ids)


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_folded_scales_keep_the_function(kind):
    model = planted_model(kind)
    ids = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        before = model(ids)
        for block in model.model.layers:
            for group in model.cfg.arch.scale_groups:
                reduce, expand = head_mapping(block, group, model.cfg.head_dim)
                width = block.get_submodule(group.prev).weight.shape[0]
                fold_scales(block, group, torch.rand(width) * 4 + 0.25, expand)
        after = model(ids)
    assert (after - before).abs().max().item() <= 1e-5


def test_gqa_head_mapping_repeats_kv_scales():
    block = planted_model().model.layers[0]  # 4 heads, 2 KV heads, head_dim 16
    group = next(g for g in planted_model().cfg.arch.scale_groups if g.prev == "self_attn.v_proj")
    reduce, expand = head_mapping(block, group, 16)
    s = torch.arange(32.0)
    e = expand(s)
    assert e.shape == (64,)
    assert torch.equal(e[:16], s[:16]) and torch.equal(e[16:32], s[:16]) and torch.equal(e[32:48], s[16:])
    assert torch.equal(reduce(e), s)


def test_candidate_scales_start_at_plain_rounding():
    cands = candidate_scales(torch.rand(10) + 0.1, 20)
    assert cands.shape == (20, 10)
    assert torch.allclose(cands[0], torch.ones(10))
    assert torch.allclose(cands.amax(1) * cands.amin(1), torch.ones(20), atol=1e-5)


def output_error(w, q, x):
    return (x @ (q - w).T).pow(2).mean().item()


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_range_search_beats_plain_rounding(symmetric, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(32, 128, generator=g)
    w[:, 5] *= 8  # a few large weights make the full range wasteful
    x = torch.randn(256, 128, generator=g)
    spec = IntSpec(3, 64, symmetric)
    found = search_qparams(w, group_hessians(x, 64), spec)
    assert output_error(w, pseudo_quantize(w, spec, found), x) < 0.9 * output_error(w, pseudo_quantize(w, spec), x)


def test_range_search_shrinks_top_and_bottom_independently():
    # Column 1 holds each row's largest weight but its input is ~0, so clipping it is free; column 0
    # holds the most negative weight and a busy input. The top shrinks far, the bottom stays: a
    # shared shrink of both ends (AWQ's +-max clip, or one ratio for both) cannot do that.
    g = torch.Generator().manual_seed(0)
    w = torch.rand(16, 64, generator=g) - 0.5
    w[:, 0], w[:, 1] = -6.0, 3.0
    x = torch.randn(512, 64, generator=g)
    x[:, 1] *= 1e-3
    spec = IntSpec(4, 64)
    scale, zero = search_qparams(w, group_hessians(x, 64), spec)
    bottom, top = -zero * scale, (spec.qmax - zero) * scale  # [16, 1] the grid's ends
    assert (top < 2.5).all()
    assert (bottom < -6.0 + scale).all()  # -6 within a step of the bottom code


def test_refit_scale_is_the_weighted_least_squares_optimum():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(300, 32, generator=g)
    h = group_hessians(x, 16)  # [2, 16, 16]
    assert torch.allclose(h[1], x[:, 16:].T @ x[:, 16:] / 300, atol=1e-5)
    wg = torch.randn(2, 4, 16, generator=g)  # [G, o, g]
    codes = (wg / 0.3).round().clamp(-8, 7)  # rounded on a grid of 0.3, clipped at the ends
    s = refit_scale(wg, codes, torch.full((2, 4), 0.3), h)
    assert not torch.allclose(s, torch.full((2, 4), 0.3))

    def err(scale):
        return weighted_error(codes * scale[..., None] - wg, h)

    e = codes * s[..., None] - wg  # [2, 4, 16]
    direct = torch.stack([((x[:, 16 * j:16 * j + 16] @ e[j].T) ** 2).mean(0) for j in range(2)])  # [2, 4]
    assert torch.allclose(err(s), direct, rtol=1e-4)  # e^T H e is the group's mean squared partial output error
    for step in (0.99, 1.01):
        assert (err(s) <= err(s * step) + 1e-6).all()


def reference_search(w, h, spec, grid=20, max_shrink=0.5):
    """The exhaustive range search as first written, one candidate at a time over [O, G, g]: the oracle."""
    wg = grouped(w, spec.group_size)  # [O, G, g]

    def error(s, z):  # [O, G]
        codes = grouped(primitives.quantize(w, s, z, spec), spec.group_size).float() - z[..., None].float()
        e = codes * s[..., None] - wg
        return (torch.bmm(e.transpose(0, 1), h).transpose(0, 1) * e).sum(-1), codes

    shrinks = [1 - i / grid for i in range(max(1, int(max_shrink * grid)))]
    pairs = [(a, a) for a in shrinks] if spec.symmetric else [(a, b) for a in shrinks for b in shrinks]
    best_s, best_z = qparams(w, spec)
    best_err = error(best_s, best_z)[0]
    for a, b in pairs:
        s, z = range_qparams(wg.amax(-1) * a, wg.amin(-1) * b, spec)
        codes = error(s, z)[1]
        ch = torch.bmm(codes.transpose(0, 1), h).transpose(0, 1)
        num, den = (ch * wg).sum(-1), (ch * codes).sum(-1)
        fit = num / den.clamp(min=1e-30)
        s = torch.where((den > 0) & (fit > 0), fit, s)
        err = error(s, z)[0]
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        best_s, best_z = torch.where(better, s, best_s), torch.where(better, z, best_z)
    return best_s, best_z


def outlier_layer(seed, out=48, width=256):
    """Weights with a few large columns, and inputs with a few loud channels and shared directions (as in LLMs)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(out, width, generator=g) * 0.02
    w[:, torch.randperm(width, generator=g)[:3]] *= 6
    x = torch.randn(512, width, generator=g) + torch.randn(512, 4, generator=g) @ torch.randn(4, width, generator=g) / 2
    x[:, torch.randperm(width, generator=g)[:4]] *= 20
    return w, x


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("spec", [IntSpec(4, 64), IntSpec(3, 64), IntSpec(4, 32, symmetric=True), IntSpec(3, 128)])
@pytest.mark.parametrize("seed", [0, 1])
def test_exhaustive_range_search_matches_the_reference_exactly(monkeypatch, spec, seed, fused):
    """Both paths, the C kernel's (where it is built and takes the group size) and torch's."""
    w, x = outlier_layer(seed)
    h = group_hessians(x, spec.group_size)
    if fused and not awq.fused_search(grouped(w, spec.group_size).transpose(0, 1), spec):
        pytest.skip("no C kernel for this group size here")
    if not fused:
        monkeypatch.setattr(awq, "fused_search", lambda *a: False)
    scale, zero = search_qparams(w, h, spec)
    ref_scale, ref_zero = reference_search(w, h, spec)
    assert torch.equal(scale, ref_scale) and torch.equal(zero, ref_zero)
    assert zero.dtype == torch.int32


def test_the_c_kernel_takes_the_usual_group_sizes_here():
    """On an x86 host with a C compiler (this project's machines), 64 and 128 go through the kernel."""
    if range_search_cpu.load() is None:
        pytest.skip("no C compiler")
    for g in (64, 128):
        assert awq.fused_search(torch.zeros(1, 8, g), IntSpec(4, g))


@pytest.mark.parametrize("threads", [1, 2])
def test_search_gives_the_same_grids_on_any_thread_count(threads):
    """The tiles run side by side, one thread each: the result is the one-thread result (and the reference's)."""
    w, x = outlier_layer(3, out=512)
    spec = IntSpec(4, 64)
    h = group_hessians(x, spec.group_size)
    assert awq.tile_weights(w.device, w.numel()) < w.numel()  # several tiles
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        scale, zero = search_qparams(w, h, spec)
    finally:
        torch.set_num_threads(before)
    ref_scale, ref_zero = reference_search(w, h, spec)
    assert torch.equal(scale, ref_scale) and torch.equal(zero, ref_zero)
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("spec", [IntSpec(4, 32), IntSpec(3, 64), IntSpec(4, 32, symmetric=True), IntSpec(3, 64, symmetric=True)])
def test_scaled_round_trip_is_the_expression_bit_for_bit(monkeypatch, spec, dtype, fused):
    """Through the C kernel (fp32) or torch's ops: the numbers of the plain expression, zero groups included."""
    if fused and (dtype != torch.float32 or round_trip_cpu.load() is None):
        pytest.skip("the C kernel takes fp32 where a C compiler works")
    if not fused:
        monkeypatch.setattr(round_trip_cpu, "supports", lambda *args: False)
    monkeypatch.setattr(awq, "ROUND_TRIP_ELEMENTS", 5 * 128)  # blocks of 5 rows, the last one short
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(33, 128, generator=g) * 0.05).to(dtype)
    w[:, 7] *= 20
    w[3], w[4, :64], w[5, :64] = 0, -0.0, 1e-12  # degenerate groups: the 1e-8 floor of the range, zero point 0
    se = (torch.rand(128, generator=g) * 3 + 0.25).to(dtype)
    assert torch.equal(scaled_round_trip(w, se, spec), pseudo_quantize(w * se, spec) / se)


@pytest.mark.parametrize("bits", [3, 4])
def test_gptq_rounding_fits_the_calibration_set_better(bits):
    """Same scales and grids, other codes: GPTQ minimizes each Linear's output error on the calibration
    inputs, so the quantized model's logits on them are closer to the original's than nearest rounding's."""
    calib = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = planted_model()(calib)
    errors = {}
    for rounding in ("gptq", "nearest"):
        model = planted_model()
        quantize(model, QuantConfig(method="awq", bits=bits, group_size=32, search_sequences=4, search_tokens=256, rounding=rounding), calib=calib)
        errors[rounding] = output_mse(model, ref, calib)
    assert errors["gptq"] < 0.9 * errors["nearest"]


def test_gptq_sees_each_linears_inputs_after_the_fold(monkeypatch):
    """Folding keeps q, k, o, gate and down's outputs, so for the folded weight W and the H that GPTQ gets,
    tr(W H W^T) = E|y|^2 must match the outputs of the original block 0 on the calibration tokens."""
    from compress.quant import awq_apply

    seen = {}  # block 0's Linears by name (GPTQ runs them side by side, in no fixed order)
    real = awq_apply.gptq_codes
    calib = torch.randint(0, 256, (8, 64), generator=torch.Generator().manual_seed(0))
    fp, model = planted_model(), planted_model()
    names = {id(m.weight): name for name, m in model.model.layers[0].named_modules() if isinstance(m, torch.nn.Linear)}
    monkeypatch.setattr(awq_apply, "gptq_codes", lambda w, h, *a: seen.setdefault(names.get(id(w)), (w.clone(), h)) and real(w, h, *a))
    outputs = {}
    block = fp.model.layers[0]
    for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"):
        block.get_submodule(name).register_forward_hook(lambda m, a, y, name=name: outputs.__setitem__(name, y.pow(2).sum(-1).mean().item()))
    with torch.no_grad():
        fp(calib)
    quantize(model, QuantConfig(method="awq", bits=4, group_size=32, search_sequences=4, search_tokens=256), calib=calib)
    for name, value in outputs.items():
        w, h = seen[name]
        assert torch.trace(w.float() @ h @ w.float().T).item() == pytest.approx(value, rel=1e-3), name
