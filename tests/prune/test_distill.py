"""Distillation lowers the KD loss; an interrupted run resumes to the same weights as an uninterrupted one."""

import json
import os
import signal
from pathlib import Path

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


def stopped_in_step_4(model, config: DistillConfig, ckpt: Path, monkeypatch) -> Distiller:
    """A run that gets Ctrl-C during its step 4: the step finishes, then the run saves and stops."""
    run = Distiller(model, student_of(model), data(), data(8), config, ckpt)
    step = run.train_step

    def ctrl_c_during_step_4():
        if run.step == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return step()
    monkeypatch.setattr(run, "train_step", ctrl_c_during_step_4)
    with pytest.raises(KeyboardInterrupt):
        run.run()
    return run


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

    assert stopped_in_step_4(model, cfg(8, grad_accum=2), tmp_path / "b", monkeypatch).step == 4
    resumed = Distiller(model, student_of(model), data(), data(8), cfg(8, grad_accum=2), tmp_path / "b")
    resumed.load()
    assert resumed.step == 4
    resumed.run()
    a, b = (d.model.state_dict() for d in (straight, resumed))
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


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_resume_with_two_processes_continues_a_one_process_run(teacher, tmp_path, monkeypatch, mode):
    """The state holds nothing that depends on the number of processes or on sharding: stop one process after step
    4 of 8, finish with two (over gloo, each on half of every micro-batch; DDP or sharded), and land where one
    process lands, weights and optimizer state (the two processes' final checkpoint, read back in one)."""
    from safetensors.torch import load_file
    from compress.prune import sharding
    from tests.conftest import launch

    path, model = teacher
    straight = Distiller(model, student_of(model), data(), data(8), cfg(16, grad_accum=2), tmp_path / "a")
    straight.run()
    stopped_in_step_4(model, cfg(16, grad_accum=2), tmp_path / "b", monkeypatch)
    worker = Path(__file__).with_name("distill_worker.py")
    res = launch(2, str(worker), str(path), str(tmp_path / "b"), str(tmp_path / "out"), "16", mode)
    assert res.returncode == 0, res.stderr[-3000:]
    got = load_file(tmp_path / "out" / "student.safetensors")
    want = straight.model.state_dict()
    assert got.keys() == want.keys() and max((got[k] - want[k]).abs().max().item() for k in want) < 1e-5
    read_back = Distiller(model, student_of(model), data(), data(8), cfg(16, grad_accum=2), tmp_path / "b")
    read_back.load()
    assert read_back.step == straight.step == 8
    a, b = (sharding.optimizer_state(d.model, d.optimizer.optimizer, False)["state"] for d in (straight, read_back))
    assert a.keys() == b.keys() and a
    for k in a:
        for moment in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(b[k][moment], a[k][moment], rtol=1e-3, atol=1e-4 * a[k][moment].abs().max().item())
    curve = json.loads((tmp_path / "out" / "curve.json").read_text())
    assert [p["step"] for p in curve] == [p["step"] for p in straight.curve]
    for a, b in zip(curve, straight.curve):
        assert a.get("kd_loss", 0) == pytest.approx(b.get("kd_loss", 0), rel=1e-4)
    halves = [torch.load(tmp_path / "out" / f"rows-{r}.pt", weights_only=True) for r in (0, 1)]
    assert sorted(halves[0]) == list(range(8, 16))  # steps 5-8, two micro-batches each
    for micro, rows in halves[0].items():  # each process trained on its half of the same global micro-batch
        assert rows.shape[0] == 2 and torch.equal(torch.cat([rows, halves[1][micro]]), straight.batch(micro))
