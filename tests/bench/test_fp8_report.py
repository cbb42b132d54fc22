"""fp8's loss breakdown: the roundings it compares and the hooks that apply them to one Linear kind."""

import torch

from compress import models
from compress.bench import fp8_report
from compress.quant.fp8 import to_e4m3


def test_mantissa_only_is_e4m3_where_e4m3_has_its_full_precision_and_finer_below():
    g = torch.Generator().manual_seed(0)
    normal = torch.exp(torch.empty(4096).uniform_(-4.0, 5.9, generator=g)) * torch.randn(4096, generator=g).sign()
    normal = normal.clamp(-448, 448)  # [2^-6, 448]: e4m3's normal range at scale 1
    normal = normal[normal.abs() >= 2**-6]
    assert torch.equal(fp8_report.mantissa_only(normal), to_e4m3(normal, torch.tensor(1.0)).float())
    tiny = torch.tensor([3e-3, -7.3e-4, 1e-6])  # e4m3 subnormals or zero at scale 1; the unbounded exponent keeps 4 bits
    relative = (fp8_report.mantissa_only(tiny) - tiny).abs() / tiny.abs()
    assert relative.max() <= 1 / 16 and not torch.equal(to_e4m3(tiny, torch.tensor(1.0)).float(), fp8_report.mantissa_only(tiny))
    assert fp8_report.mantissa_only(torch.tensor([1000.0])).item() == 1024.0  # no saturation at 448 either


def on_e4m3_grid(x: torch.Tensor) -> bool:
    return torch.equal(x, fp8_report.e4m3_per_token(x))


def test_each_row_changes_only_what_it_names(fp_dir):
    x = torch.randint(0, 256, (1, 16))
    base = models.load_model(fp_dir)(x)
    model = models.load_model(fp_dir)
    fp8_report.changes()["e4m3 activations of self_attn.q_proj only"](model)
    seen = {}  # hooks run in the order they were registered: these see the rounded inputs
    for name, mod in model.named_modules():
        if name.endswith(("q_proj", "down_proj")):
            mod.register_forward_pre_hook(lambda m, args, n=name: seen.setdefault(n, args[0].clone()))
    assert (model(x) - base).abs().max().item() > 1e-4
    assert sorted(n.split(".")[-1] for n in seen) == ["down_proj", "down_proj", "q_proj", "q_proj"]
    assert all(on_e4m3_grid(v) == n.endswith("q_proj") for n, v in seen.items())
    assert (models.load_model(fp_dir)(x) - base).abs().max().item() == 0  # a fresh load carries no hooks
    for label in ("e4m3 per-token activations only", "e4m3 weights only (nearest)", "fp32"):
        model = models.load_model(fp_dir)
        fp8_report.changes()[label](model)
        assert ((model(x) - base).abs().max().item() > 1e-4) == (label != "fp32")


def test_rounded_input_is_on_each_tokens_e4m3_grid():
    x = torch.randn(3, 5, 64) * torch.tensor([1.0, 100.0, 0.01])[:, None, None]  # [B, T, I], tokens of other ranges
    y = fp8_report.e4m3_per_token(x)
    scale = x.abs().amax(-1, keepdim=True) / 448  # [B, T, 1]
    assert torch.equal(y, to_e4m3(x, scale).float() * scale)
    assert ((y - x).abs() <= x.abs() / 16 + scale * 2**-9).all()  # half an e4m3 step: 2^-4 relative, subnormal floor


def test_per_layer_rows_leave_exactly_one_layer_unrounded(fp_dir):
    src = models.load_model(fp_dir)
    rows = fp8_report.layer_rows(src.cfg.num_layers)
    assert list(rows)[:2] == ["fp32", "fp8 weights and activations"] and len(rows) == 2 + src.cfg.num_layers
    model = models.load_model(fp_dir)
    rows["fp8 but layer 1"](model)
    seen = {}
    for name, mod in model.named_modules():
        if name.endswith("q_proj"):
            mod.register_forward_pre_hook(lambda m, args, n=name: seen.setdefault(n, args[0].clone()))
    model(torch.randint(0, 256, (1, 16)))
    for name, mod in model.named_modules():
        if name.endswith("_proj"):
            layer1 = name.startswith("model.layers.1.")
            assert torch.equal(mod.weight, src.get_submodule(name).weight) == layer1, name
    assert {n: on_e4m3_grid(v) for n, v in seen.items()} == {f"model.layers.{i}.self_attn.q_proj": i != 1 for i in range(len(seen))}


def test_table_reports_the_loss_each_row_recovers():
    rows = [("fp32", 20.0), ("fp8", 21.0), ("fp8 but layer 0", 20.75)]
    assert fp8_report.table(rows)[-1] == "| fp8 but layer 0 | 20.750 | +3.75 % |"  # the kinds' report: no share column
    lines = fp8_report.table(rows, recovered=True)
    assert lines[-1] == "| fp8 but layer 0 | 20.750 | +3.75 % | +0.250 |"
