"""The backend comparison: subject by subject, both backends, resumable from its state file."""

import json

import pytest

from compress.errors import UserError
from compress.bench import eval_backends


def run(tiny_dir, state, *extra):
    eval_backends.main.main(["--model", str(tiny_dir), "--subjects", "anatomy,virology", "--limit", "2",
                             "--hf-batch-size", "4", "--state", str(state), *extra], standalone_mode=False)


def test_both_backends_score_every_subject_and_a_rerun_resumes(data_dir, tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path / "cache"))
    state = tmp_path / "bench.jsonl"
    run(tiny_dir, state)
    first = capsys.readouterr().out
    lines = state.read_text().splitlines()
    assert json.loads(lines[0])["config"]["subjects"] == ["anatomy", "virology"]
    rows = [json.loads(line) for line in lines[1:]]
    # each subject by both, the first backend alternating
    assert [(r["subject"], r["backend"]) for r in rows] == [
        ("anatomy", "hf"), ("anatomy", "compress"), ("virology", "compress"), ("virology", "hf")]
    assert all(r["n"] == 2 and r["seconds"] > 0 for r in rows)
    for subject in ("anatomy", "virology"):  # the tiny model's answers are the same on both backends
        assert len({r["acc"] for r in rows if r["subject"] == subject}) == 1
    assert "4 questions in 2 of 57 subjects" in first and "accuracy difference +0.00 points" in first

    # a kill while writing leaves a torn last line: that subject is scored again, the rest is kept
    state.write_text("\n".join(lines[:-1]) + '\n{"subject": "viro')
    monkeypatch.setattr(eval_backends, "make_backends", lambda *a: {"hf": "HF", "compress": "OURS"})
    calls = []
    monkeypatch.setattr("compress.eval.harness.run_mmlu", lambda lm, k, limit, subjects: calls.append((lm, subjects))
                        or {"subjects": {subjects[0]: rows[-1] | {"seconds": 0}}})
    run(tiny_dir, state, "--summary")  # prints the table, scores nothing
    assert calls == [] and "2 questions in 1 of 57 subjects" in capsys.readouterr().out
    run(tiny_dir, state)
    assert calls == [("HF", ["virology"])]
    assert "4 questions in 2 of 57 subjects" in capsys.readouterr().out
    run(tiny_dir, state)  # the rewritten file holds whole lines only: nothing is scored again
    assert calls == [("HF", ["virology"])]
    assert [json.loads(line) for line in state.read_text().splitlines()[1:]][:3] == rows[:3]


def test_an_empty_or_torn_header_state_file_starts_afresh(data_dir, tiny_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(eval_backends, "make_backends", lambda *a: {"hf": "HF", "compress": "OURS"})
    monkeypatch.setattr("compress.eval.harness.run_mmlu", lambda lm, k, limit, subjects:
                        {"subjects": {subjects[0]: {"acc": 0.5, "n": 2}}})
    for text in ("", '{"conf'):
        state = tmp_path / "bench.jsonl"
        state.write_text(text)
        run(tiny_dir, state)
        assert len(state.read_text().splitlines()) == 1 + 4
        state.unlink()


def test_the_table_needs_a_subject_both_backends_finished():
    assert eval_backends.table([{"subject": "anatomy", "backend": "hf", "seconds": 1.0, "acc": 0.5, "n": 2}],
                               "m", 0, "hf") == "no subject has been scored by both backends yet"


def test_a_state_file_of_another_run_is_refused(data_dir, tiny_dir, tmp_path):
    state = tmp_path / "bench.jsonl"
    state.write_text(json.dumps({"config": {"model": "other"}}) + "\n")
    with pytest.raises(UserError, match="holds another run"):
        run(tiny_dir, state)


def test_an_unknown_subject_is_refused(data_dir, tiny_dir, tmp_path):
    with pytest.raises(UserError, match="unknown MMLU subject astrology"):
        eval_backends.main.main(["--model", str(tiny_dir), "--subjects", "astrology"], standalone_mode=False)
