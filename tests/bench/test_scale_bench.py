"""The random-checkpoint writer, the /usr/bin/time -v parser, and the scale benchmark's dry run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from compress.bench import random_checkpoint as rc
from compress.bench.scale_bench import Row, format_table, last_line, parse_steps, parse_time_v, run_timed

SHARD = 2 * 2**20  # the tiny shape is ~12 MiB in bf16: several shards


@pytest.fixture(scope="module")
def written(tmp_path_factory, smollm2_dir):
    """The tiny shape written with small shards, and the byte count of every save_file call."""
    calls, save = [], rc.save_file
    mp = pytest.MonkeyPatch()
    mp.setattr(rc, "save_file", lambda tensors, *a, **k: (calls.append(sum(t.nbytes for t in tensors.values())),
                                                           save(tensors, *a, **k)))
    try:
        out = rc.write_random_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny", rc.SHAPES["tiny"],
                                         shard_bytes=SHARD, tokenizer_dir=smollm2_dir)
    finally:
        mp.undo()
    return out, calls


def test_writer_shards_and_index(written):
    out, _ = written
    index = json.loads((out / "model.safetensors.index.json").read_text())
    specs = dict(rc.tensor_specs(rc.SHAPES["tiny"]))
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert set(index["weight_map"]) == set(specs)
    seen, total = set(), 0
    for shard in shards:
        with safe_open(str(out / shard), "pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                assert index["weight_map"][name] == shard and tuple(t.shape) == specs[name]
                assert t.dtype == torch.bfloat16
                seen.add(name)
                total += t.nbytes
    assert seen == set(specs) and index["metadata"]["total_size"] == total


def test_writer_values(written):
    out, _ = written
    where = json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]
    emb, norm = "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight"
    with safe_open(str(out / where[emb]), "pt") as f:
        assert abs(f.get_tensor(emb).float().std().item() - 0.02) < 1e-3
    with safe_open(str(out / where[norm]), "pt") as f:
        assert torch.equal(f.get_tensor(norm), torch.ones(64, dtype=torch.bfloat16))


def test_writer_config_loads_in_transformers(written, smollm2_dir):
    from transformers import AutoConfig

    out, _ = written
    cfg = AutoConfig.from_pretrained(str(out))
    src = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg.model_type == "llama" and cfg.dtype == torch.bfloat16
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (64, 128, 2)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size) == (4, 2, 49152)
    assert not cfg.tie_word_embeddings
    assert (cfg.bos_token_id, cfg.eos_token_id) == (src["bos_token_id"], src["eos_token_id"])
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (out / "tokenizer.json").is_file()


def test_writer_holds_one_shard_at_a_time(written):
    _, calls = written
    largest = max(2 * torch.Size(size).numel() for _, size in rc.tensor_specs(rc.SHAPES["tiny"]))
    assert len(calls) > 1
    assert max(calls) <= SHARD + largest  # never the whole model (~12 MiB) in one call
    assert max(calls) < sum(calls)


def test_writer_reuses_a_complete_checkpoint(written, smollm2_dir):
    out, _ = written
    mtime = (out / "config.json").stat().st_mtime_ns
    rc.write_random_checkpoint(out, rc.SHAPES["tiny"], shard_bytes=SHARD, tokenizer_dir=smollm2_dir)
    assert (out / "config.json").stat().st_mtime_ns == mtime
    assert not list(out.parent.glob(".*partial*"))


def test_llama3_8b_shape():
    specs = rc.tensor_specs(rc.SHAPES["llama3-8b"])
    params = sum(torch.Size(s).numel() for _, s in specs)
    assert dict(specs)["model.layers.0.self_attn.k_proj.weight"] == (1024, 4096)
    assert dict(specs)["lm_head.weight"] == (49152, 4096)
    assert 7.3e9 < params < 7.5e9  # Llama-3-8B's 8.03B less the 128k -> 49k vocabulary
    plan = rc.plan_shards(specs, 2, rc.SHARD_BYTES)
    assert all(sum(2 * torch.Size(s).numel() for _, s in shard) <= rc.SHARD_BYTES for shard in plan)


def test_qwen3_moe_shape_and_its_dense_twin_read_the_same_weights_per_token():
    from compress.model.config import ModelConfig
    from compress.roofline import formats, param_counts

    moe, dense = (ModelConfig.from_hf(rc.hf_config(rc.SHAPES[name], torch.bfloat16)) for name in ("qwen3-30b-a3b-8l", "qwen3-dense-a3b-8l"))
    specs = dict(rc.tensor_specs(rc.SHAPES["qwen3-30b-a3b-8l"]))
    assert specs["model.layers.7.mlp.gate.weight"] == (128, 2048)  # the router
    assert specs["model.layers.7.mlp.experts.127.down_proj.weight"] == (2048, 768)
    assert moe.moe.layers == tuple(range(8)) and moe.moe.top_k == 8 and moe.moe.renormalize
    params = sum(torch.Size(s).numel() for s in specs.values())
    assert 5.5e9 < params < 5.7e9  # ~11 GB bf16
    n_moe, n_dense = param_counts(moe), param_counts(dense)
    assert n_moe["active"] - n_moe["mlp"] == n_dense["total"]  # the same, but for the routers
    assert formats(moe)[3].group_size == formats(dense)[3].group_size == 128


TIME_V = """\
Command exited with non-zero status 1
\tCommand being timed: "python -m compress.cli quantize src --method rtn"
\tUser time (seconds): 3512.20
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50
\tMaximum resident set size (kbytes): 15728640
\tExit status: 1
"""


def test_parse_time_v():
    assert parse_time_v(TIME_V) == (15728640 * 1024, 3723.5)
    assert parse_time_v(TIME_V.replace("1:02:03.50", "0:07.25")) == (15728640 * 1024, 7.25)
    with pytest.raises(ValueError):
        parse_time_v("Command terminated by signal 9")


def test_last_line_of_progress_bars():
    assert last_line("loading\rblock 1/32\rblock 2/32\nerror: out of memory\n\n") == "error: out of memory"
    assert last_line("") == ""


def test_run_timed_reports_a_failure(tmp_path):
    code = "import sys; print('working', file=sys.stderr); sys.exit('error: no such model')"
    rc, peak, wall, err, _ = run_timed([sys.executable, "-c", code], tmp_path, "step")
    assert (rc, err) == (1, "error: no such model")
    assert peak > 2**20 and 0 < wall < 60
    assert "Maximum resident set size" in (tmp_path / "step.time").read_text()


def test_parse_steps_and_table():
    assert parse_steps("rtn,eval", ("awq",)) == ["write", "rtn", "eval"]
    assert parse_steps("write,rtn,awq,generate,eval", ("awq",)) == ["write", "rtn", "generate", "eval"]
    table = format_table([Row("llama3-8b", "rtn", 3 * 2**30, 61.0, 15 * 2**30, 5 * 2**30),
                          Row("llama3-8b", "eval", status="failed (exit 137): Killed")])
    assert "| llama3-8b | rtn | 3.00 | 61.0 | 15.00 GiB | 5.00 GiB | 3.00x | ok |" in table
    assert "| llama3-8b | eval | - | - | - | - | - | failed (exit 137): Killed |" in table


@pytest.mark.slow
def test_dry_run(tmp_path, smollm2_dir, data_dir):
    """The whole benchmark on the tiny shape: every step runs and is reported (~40 s on 2 cores)."""
    report = tmp_path / "scale.md"
    proc = subprocess.run([sys.executable, "-m", "compress.bench.scale_bench", "--dry-run", "--out", str(report)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-2000:]
    text = report.read_text()
    assert "command: `python -m compress.bench.scale_bench --dry-run" in text and "torch " in text
    for step in ("write", "rtn", "awq", "generate (rtn)", "eval"):
        assert f"| tiny | {step} |" in text
    assert "failed" not in text
