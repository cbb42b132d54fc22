"""`compress bench --draft`: the speculative comparison on the tiny model, through the CLI."""

import pytest
from click.testing import CliRunner

from compress.bench.command import BenchConfig
from compress.bench.speculative import run_spec_bench, table
from compress.bench.sweep import SweepConfig
from compress.cli import cli
from compress.errors import UserError


def test_rows_per_batch_size_with_acceptance_and_identical_tokens(tiny_dir, data_dir):
    rows = run_spec_bench(str(tiny_dir), [str(tiny_dir)], 3, SweepConfig((1, 2), prompt_len=16, new_tokens=9), {})
    assert [(r["batch"], "acceptance" in r) for r in rows] == [(1, False), (1, True), (2, False), (2, True)]
    spec = rows[1]
    assert spec["identical"] and spec["acceptance"] == [1.0, 1.0, 1.0]
    assert spec["tokens_per_step"] == 4.0  # 8 tokens after the prefill's first: two steps of 4
    assert "| 1.00 / 1.00 / 1.00 | 4.00 | yes |" in table(rows)


def test_cli_prints_the_table_and_rejects_bad_batch_sizes(tiny_dir, data_dir):
    args = ["bench", str(tiny_dir), "--draft", str(tiny_dir), "--batch-sizes", "1", "--prompt-len", "8", "--new-tokens", "4"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "| none (target alone) | 1 |" in result.output
    bad = CliRunner().invoke(cli, args[:4] + ["--batch-sizes", "0"], standalone_mode=False)
    assert bad.exception is not None and "batch-sizes" in str(bad.exception)


def test_sampled_rows_leave_the_same_tokens_column_open_and_ngram_is_a_draft(tiny_dir, data_dir):
    rows = run_spec_bench(str(tiny_dir), ["ngram"], 3, SweepConfig((1,), prompt_len=16, new_tokens=9), {}, temperature=0.8)
    assert rows[1]["draft"] == "ngram" and rows[1]["identical"] is None
    assert table(rows).splitlines()[-1].endswith("| - |")


def test_cli_passes_the_draft_vocabulary_and_rejects_a_negative_temperature(tiny_dir, data_dir):
    args = ["bench", str(tiny_dir), "--draft", str(tiny_dir), "--batch-sizes", "1", "--prompt-len", "8", "--new-tokens", "4"]
    # the tiny model's outputs repeat the last prompt token, almost never an id below 10: drafts are rejected
    result = CliRunner().invoke(cli, args + ["--draft-vocab", "10", "--num-speculative-tokens", "2"])
    assert result.exit_code == 0, result.output
    assert "| 0.00 / 0.00 |" in result.output
    bad = CliRunner().invoke(cli, args + ["--temperature", "-1"], standalone_mode=False)
    assert bad.exception is not None and "--temperature" in str(bad.exception)


def test_speculative_options_without_a_draft_are_refused():
    for option in (dict(temperature=0.7), dict(draft_vocab=100)):
        with pytest.raises(UserError, match="give --draft"):
            BenchConfig(**option)
    BenchConfig(drafts=("ngram",), temperature=0.7, draft_vocab=100)  # fine with a draft
