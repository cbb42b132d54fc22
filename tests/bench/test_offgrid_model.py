"""The off-grid reference model's pieces: the grid-distance measure, the dither, a training step on a tiny random
model, the documents held apart from calibration, and `smollm2-135m-offgrid` missing from the cache."""

import json
from types import SimpleNamespace

import pytest
import torch

from compress import models
from compress.bench import offgrid_model as og
from compress.calib import calibration_tokens
from compress.errors import UserError
from compress.model.config import ModelConfig
from compress.model.load import build, load_weights
from tests.conftest import tiny_hf


def random_grid(out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Weights on a Q4_1 grid [O, I] and that grid's step and offset [O, I/32]."""
    g = torch.Generator().manual_seed(seed)
    step = torch.rand(out, inp // og.BLOCK, generator=g) * 0.01 + 0.001
    low = -8 * step + torch.randn(out, inp // og.BLOCK, generator=g) * 0.001
    codes = torch.randint(0, og.LEVELS, (out, inp), generator=g).float()
    codes[:, ::og.BLOCK], codes[:, 1::og.BLOCK] = 0, og.LEVELS - 1  # every block spans its grid, as Q4_1 makes it
    w = low.repeat_interleave(og.BLOCK, -1) + codes * step.repeat_interleave(og.BLOCK, -1)
    return w, step, low


def test_grid_distance_is_zero_on_the_grid_and_a_quarter_for_uniform_weights():
    w, step, low = random_grid(64, 256)
    assert og.grid_distance(w, step, low) < 1e-4  # fp32 rounding of m + q d only
    g = torch.Generator().manual_seed(1)
    top = (low + (og.LEVELS - 1) * step).repeat_interleave(og.BLOCK, -1)
    bottom = low.repeat_interleave(og.BLOCK, -1)
    uniform = bottom + torch.rand(w.shape, generator=g) * (top - bottom)
    assert abs(og.grid_distance(uniform, step, low) - 0.25) < 0.005  # 16,384 weights: the mean's sd is 0.0011


def test_dither_by_one_step_spreads_weights_evenly_over_their_cells():
    w, step, low = random_grid(64, 256)
    model = SimpleNamespace(named_parameters=lambda: [("w", torch.nn.Parameter(w.clone()))])
    params = dict(model.named_parameters())
    model.named_parameters = lambda: params.items()
    og.dither(model, {"w": (step, low)}, 1.0, seed=0)
    assert abs(og.grid_distance(params["w"].detach(), step, low) - 0.25) < 0.005
    assert (params["w"].detach() - w).abs().max() <= step.max() / 2


def test_q4_1_rounding_error_is_zero_on_the_grid_and_rtn_error_ratio_is_one_for_shuffled_noise():
    w, _, _ = random_grid(64, 256)
    assert og.q4_1_error(w) < 1e-10 < og.q4_1_error(og.shuffled_rows(w))
    noise = torch.randn(64, 256)
    assert og.rtn_error(noise) == pytest.approx(og.rtn_error(og.shuffled_rows(noise)), rel=0.1)


def test_training_moves_every_decoder_matrix():
    hf = tiny_hf("llama", vocab=64)
    teacher = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), dict(hf.state_dict()))
    model = load_weights(build(ModelConfig.from_hf(hf.config.to_dict())), {k: v.clone() for k, v in hf.state_dict().items()})
    names = [n for n, p in model.named_parameters() if n.endswith("proj.weight")]
    grids = {n: (torch.full((p.shape[0], p.shape[1] // og.BLOCK), 0.05), torch.zeros(p.shape[0], p.shape[1] // og.BLOCK))
             for n, p in model.named_parameters() if n in names}
    og.dither(model, grids, 1.0, seed=0)  # the student differs from its teacher, so the loss has a gradient
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    rows = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    curve = og.train(model, teacher, rows, lr=1e-3, batch=2, steps=2)
    assert [c["step"] for c in curve] == [1, 2] and curve[0]["kd_loss"] > 0
    params = dict(model.named_parameters())
    assert all(not torch.equal(params[n], start[n]) for n in names)


def test_held_apart_documents_are_those_calibration_reads(tmp_path):
    """Each document is one distinct character; calibration's tokens name the documents it read."""
    texts = [chr(0x4E00 + i) * (5 + i % 7) for i in range(60)]
    path = tmp_path / "c4.jsonl"
    path.write_text("\n".join(json.dumps({"text": t}) for t in texts))
    tok = lambda text, add_special_tokens=True: SimpleNamespace(input_ids=[ord(c) for c in text])  # noqa: E731
    used = set()
    for seed in (0, 1):
        cfg = SimpleNamespace(calib_data=str(path), seed=seed, calib_samples=4, calib_seq_len=20)
        used |= {c - 0x4E00 for c in calibration_tokens(tok, cfg).flatten().tolist()}
    assert og.calibration_documents(tok, texts, seeds=(0, 1), tokens=80) == used


def test_the_offgrid_name_resolves_to_the_cache_or_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    assert og.NAME in models.MADE_HERE and og.default_out() == tmp_path / og.NAME
    with pytest.raises(UserError) as e:
        models.resolve(og.NAME)
    assert "make offgrid" in str(e.value) and "\n" not in str(e.value)
    (tmp_path / og.NAME).mkdir()
    (tmp_path / og.NAME / "config.json").write_text("{}")
    assert models.resolve(og.NAME) == tmp_path / og.NAME
