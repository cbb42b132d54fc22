"""`compress generate`: streams the greedy completion; bad options are one-line errors (exit 2)."""

import pytest

from compress.runtime import LLM, SamplingParams
from tests.conftest import run_main


def run(monkeypatch, capsys, *args) -> tuple[int, str, str]:
    return run_main(monkeypatch, capsys, "generate", *args)


def test_generate_prints_the_completion(tiny_dir, monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), "Hello world", "--max-tokens", "12")
    assert code == 0 and "KV cache" in err
    expected = LLM(tiny_dir, kv_cache_memory=1 << 20).generate("Hello world", SamplingParams(max_tokens=12, temperature=0))[0]
    assert out == expected.text + "\n"


def test_chat_wraps_the_prompt_in_the_template(tiny_dir, monkeypatch, capsys):
    code, out, _ = run(monkeypatch, capsys, str(tiny_dir), "Hi", "--max-tokens", "6", "--chat")
    llm = LLM(tiny_dir, kv_cache_memory=1 << 20)
    ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    expected = llm.generate(llm.tokenizer.encode(ids, add_special_tokens=False), SamplingParams(max_tokens=6, temperature=0))[0]
    assert code == 0 and out == expected.text + "\n"


@pytest.mark.parametrize("args,fragment", [(("Hi", "--top-p", "1.5"), "top_p"), (("Hi", "--max-tokens", "0"), "max_tokens"), (("",), "empty")])
def test_bad_options_are_one_line_errors(tiny_dir, monkeypatch, capsys, args, fragment):
    code, _, err = run(monkeypatch, capsys, str(tiny_dir), *args)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err


def test_cpu_lm_head_int8_is_what_the_engine_runs(tiny_dir, monkeypatch, capsys):
    code, out, err = run(monkeypatch, capsys, str(tiny_dir), "Hello world", "--max-tokens", "8", "--cpu-lm-head", "int8")
    assert code == 0 and "linear 49152x64 int8 rows (1)" in err
    llm = LLM(tiny_dir, kv_cache_memory=1 << 20, cpu_lm_head="int8")
    assert out == llm.generate("Hello world", SamplingParams(max_tokens=8, temperature=0))[0].text + "\n"
