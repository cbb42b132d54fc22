"""The GGUF comparison's bookkeeping without llama.cpp: files kept and reused with their seconds, and the table's
size ratios and gap fractions."""

import json

from compress.bench import gguf_compare as gc


def test_files_are_made_once_and_reused_with_their_seconds(tmp_path):
    calls = []

    def make(path):
        calls.append(path.name)
        path.write_bytes(b"x" * 10)
        return 1.5

    files = gc.Files(tmp_path, reuse=False)
    files.add("Q4_0", "llama.cpp", "a.gguf", make)
    assert json.loads((tmp_path / "seconds.json").read_text()) == {"a.gguf": 1.5}
    again = gc.Files(tmp_path, reuse=True)
    again.add("Q4_0", "llama.cpp", "a.gguf", make)
    again.add("Q4_0", "compress rtn", "b.gguf", make)
    assert calls == ["a.gguf", "b.gguf"] and [r["seconds"] for r in again.rows] == [1.5, 1.5]
    fresh = gc.Files(tmp_path, reuse=False)  # without --reuse every file is made again
    fresh.add("Q4_0", "llama.cpp", "a.gguf", make)
    assert calls[-1] == "a.gguf" and len(calls) == 3


def test_table_gives_sizes_and_gaps_against_llama_cpps_file_of_the_type():
    rows = [{"type": "F16", "by": "compress", "bytes": 2**21, "seconds": 1.0, "ppl_llamacpp": 20.0, "ppl_ours": 20.0},
            {"type": "Q4_0", "by": "llama.cpp", "bytes": 2**20, "seconds": 1.0, "ppl_llamacpp": 24.0, "ppl_ours": 24.1},
            {"type": "Q4_0", "by": "compress awq", "bytes": 2**20, "seconds": 9.0, "ppl_llamacpp": 21.0, "ppl_ours": 21.1}]
    lines = gc.table(rows).splitlines()
    awq = lines[-1].split(" | ")
    assert awq[1] == "compress awq" and awq[3] == "1.0000" and awq[-1].rstrip(" |") == "0.25"  # (21 - 20) / (24 - 20)
    assert lines[2].split(" | ")[-1].rstrip(" |") == "-"  # the reference has no gap of its own


def test_scores_are_computed_once_per_file_and_windows(tmp_path, monkeypatch):
    import torch

    calls = []
    monkeypatch.setattr(gc.llamacpp_files, "perplexity", lambda path, wins, threads: calls.append("llama") or 21.0)
    monkeypatch.setattr(gc, "our_perplexity", lambda path, wins: calls.append("ours") or 21.5)
    row = {"path": tmp_path / "a.gguf"}
    gc.Files(tmp_path, reuse=False).score(row, torch.zeros(2, 8), threads=1)
    assert (row["ppl_llamacpp"], row["ppl_ours"]) == (21.0, 21.5) and calls == ["llama", "ours"]
    resumed = gc.Files(tmp_path, reuse=True)  # an interrupted run resumes with the scores it had
    resumed.score(row, torch.zeros(2, 8), threads=1)
    assert calls == ["llama", "ours"] and row["ppl_llamacpp"] == 21.0
    resumed.score(row, torch.zeros(4, 8), threads=1)  # other windows: scored again
    assert calls == ["llama", "ours"] * 2


def test_tuned_awq_files_join_the_4_bit_types_only(tmp_path, monkeypatch):
    made = []

    def fake(path, *args):
        made.append((path.name, *args))
        path.write_bytes(b"x")
        return 2.0

    monkeypatch.setattr(gc, "ours", lambda model, path, *args: fake(path, *args))
    monkeypatch.setattr(gc.llamacpp_files, "quantize", lambda f32, path, t, threads: fake(path, t))
    rows = gc.files_of("m", gc.Files(tmp_path, reuse=False), ["Q4_0", "Q8_0"], tmp_path, None, [], [50], threads=1)
    assert [r["by"] for r in rows if r["type"] == "Q4_0"] == ["llama.cpp", "compress rtn", "compress awq", "compress awq tune 50"]
    assert [r["by"] for r in rows if r["type"] == "Q8_0"] == ["llama.cpp", "compress int8"]
    assert ("compress-awq-tune50-Q4_0.gguf", "awq", "Q4_0", 50) in made
    assert gc.counts("50, 200", "--tune-iters") == [50, 200] and gc.counts("", "--tune-iters") == []
