"""Distillation lowers the KD loss; an interrupted run resumes to the same weights as an uninterrupted one."""

import pytest
import torch

from compress.prune.config import DistillConfig
from compress.prune.distill import Distiller, kd_loss
from compress.prune.importance import random_importance
from compress.prune.shape import Shape
from compress.prune.slicing import prune, select

SHAPE = Shape(hidden_size=48, intermediate_size=96, num_heads=4, num_kv_heads=2, num_layers=3)


def student_of(model):
    return prune(model, select(random_importance(model, 0), Shape.of(model.cfg), SHAPE), SHAPE)


def data(rows: int = 64, seq: int = 16) -> torch.Tensor:
    return torch.randint(0, 256, (rows, seq), generator=torch.Generator().manual_seed(0))


def cfg(steps: int, **kw) -> DistillConfig:
    return DistillConfig(tokens=steps * 4 * 16, seq_len=16, batch_size=4, lr=3e-3, eval_every=1000, save_every=1000, **kw)


def test_kd_loss_is_zero_only_for_equal_distributions():
    logits = torch.randn(5, 11)
    assert kd_loss(logits, logits, 2.0).item() == pytest.approx(0, abs=1e-6)
    assert kd_loss(logits, logits + torch.randn(5, 11), 2.0).item() > 0.01


def test_short_run_lowers_the_kd_loss(teacher, tmp_path):
    _, model = teacher
    d = Distiller(model, student_of(model), data(), data(8), cfg(40, hidden_weight=0.5), tmp_path / "ckpt")
    curve = d.run()
    losses = [p["kd_loss"] for p in curve if "kd_loss" in p]
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5
    assert curve[-1]["held_out_ppl"] < curve[0]["held_out_ppl"]


def test_interrupted_run_resumes_with_identical_state(teacher, tmp_path, monkeypatch):
    _, model = teacher
    straight = Distiller(model, student_of(model), data(), data(8), cfg(8, grad_accum=2), tmp_path / "a")
    straight.run()

    first = Distiller(model, student_of(model), data(), data(8), cfg(8, grad_accum=2), tmp_path / "b")
    step = first.train_step

    def interrupt_after_three():
        if first.step == 3:
            raise KeyboardInterrupt
        return step()
    monkeypatch.setattr(first, "train_step", interrupt_after_three)
    with pytest.raises(KeyboardInterrupt):
        first.run()
    resumed = Distiller(model, student_of(model), data(), data(8), cfg(8, grad_accum=2), tmp_path / "b")
    resumed.load()
    assert resumed.step == 3
    resumed.run()
    a, b = (d.accelerator.unwrap_model(d.student).state_dict() for d in (straight, resumed))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    assert [p.get("kd_loss") for p in resumed.curve] == [p.get("kd_loss") for p in straight.curve]


def test_resume_refuses_other_settings(teacher, tmp_path):
    from compress.errors import UserError

    _, model = teacher
    d = Distiller(model, student_of(model), data(), data(8), cfg(2), tmp_path / "c")
    d.run()
    d.save()
    other = Distiller(model, student_of(model), data(), data(8), cfg(2, temperature=2.0), tmp_path / "c")
    with pytest.raises(UserError, match="other distillation settings"):
        other.load()
