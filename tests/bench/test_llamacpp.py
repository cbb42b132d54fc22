"""`compress bench MODEL --llamacpp GGUF` without llama-cpp-python: the one-line error, and the comparison's
interleaving, prompts and table with a fake llama.cpp injected (no timing is asserted)."""

import sys

import pytest

from compress.bench import llamacpp
from compress.bench.command import sweep_config
from compress.bench.llamacpp import Comparison, table
from compress.bench.sweep import SweepConfig, batch_workload
from tests.conftest import run_main

SMALL = ("--batch-sizes", "1,2", "--prompt-len", "8", "--new-tokens", "4", "--repeats", "2")


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "model.Q4_1.gguf"  # never opened: llama.cpp is missing or faked in these tests
    path.write_bytes(b"GGUF")
    return path


def test_missing_llama_cpp_is_one_line_and_exit_2(tiny_int4_dir, gguf, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError, installed or not
    code, out, err = run_main(monkeypatch, capsys, "bench", str(tiny_int4_dir), "--llamacpp", str(gguf), *SMALL)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "llama-cpp-python" in err and "compress[llamacpp]" in err
    assert out == ""


@pytest.mark.parametrize("args,fragment", [
    (("--llamacpp", "missing.gguf"), "not a .gguf file"),
    (("--llamacpp", "GGUF", "--workload", "mixed"), "--llamacpp"),
    (("--llamacpp", "GGUF", "--compare", "other"), "--llamacpp"),
])
def test_bad_input_is_one_line_and_exit_2(tiny_int4_dir, gguf, monkeypatch, capsys, args, fragment):
    args = [str(gguf) if a == "GGUF" else a for a in args]
    code, out, err = run_main(monkeypatch, capsys, "bench", str(tiny_int4_dir), *args, *SMALL)
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err


def test_interleaved_runs_share_prompts_and_print_the_ratio_table(tiny_int4_dir, gguf, monkeypatch, capsys):
    prompts = []

    def decode(prompt):
        prompts.append(prompt)
        return 40.0 * len(prompts)  # tok/s 40, 80, 120: the warm-up, then two rounds

    def fake_decoder(path, cfg, threads, vocab):
        assert path == gguf and threads >= 1 and vocab == 49152
        return decode, "fake"

    monkeypatch.setattr(llamacpp, "import_llama_cpp", lambda: None)
    monkeypatch.setattr(llamacpp, "llamacpp_decoder", fake_decoder)
    code, out, err = run_main(monkeypatch, capsys, "bench", str(tiny_int4_dir), "--llamacpp", str(gguf), *SMALL)
    assert code == 0, err
    cfg = SweepConfig((1, 2), 8, 4, repeats=2)
    # a warm-up call, then one per round with the prompt our batch-1 run of that round gets
    assert prompts[1:] == [batch_workload(1, cfg, 49152, run).prompts[0] for run in range(2)] and len(prompts[0]) == 8
    assert "llama-cpp-python fake" in out and "fastest of 2 interleaved runs" in out and "flags:" in out
    assert "our C kernels: COMPRESS_CPU_ISA=native" in out  # which x86 path ran: an AVX2-only build says avx2
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(("| llama.cpp |", "| compress |"))]
    assert [(r[0], r[2]) for r in rows] == [("| llama.cpp", "1"), ("| compress", "1"), ("| compress", "2")]
    assert rows[0][3] == "120.0"  # the fastest of llama.cpp's timed runs, not its warm-up
    for r in rows[1:]:  # the ratio of the unrounded rates: within the rounding of the printed one
        assert r[4].endswith("x") and abs(float(r[4][:-1]) - float(r[3]) / 120) <= 0.006


def test_table_gives_ratios_to_llama_cpp_batch_1_and_the_targets():
    lines = table(Comparison(96.6, {1: 45.9, 8: 200.0, 32: 300.0}), "m.gguf", "rtn4").splitlines()
    assert lines[2] == "| llama.cpp | m.gguf | 1 | 96.6 | 1.00x | - |"
    assert lines[3] == "| compress | rtn4 | 1 | 45.9 | 0.48x | >= 1.00x: not yet |"
    assert lines[4] == "| compress | rtn4 | 8 | 200.0 | 2.07x | >= 2.00x: met |"
    assert lines[5] == "| compress | rtn4 | 32 | 300.0 | 3.11x | - |"


def test_llamacpp_has_its_own_defaults_and_takes_the_options():
    assert (sweep_config(None, 64, 64, None, True).batch_sizes, sweep_config(None, 64, 64, None, True).repeats) == ((1, 8), 3)
    assert (sweep_config(None, 64, 64, None, False).batch_sizes, sweep_config(None, 64, 64, None, False).repeats) == ((1, 8, 32), 1)
    assert sweep_config("1", 64, 64, 5, True) == SweepConfig((1,), 64, 64, 5)


def test_llama_cpp_s_build_is_named_by_its_features():
    class Fake:
        @staticmethod
        def llama_print_system_info():
            return b"CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | AVX512 = 0 | F16C = 1 | OPENMP = 1 | "

    assert llamacpp.built_for(Fake) == "SSE3 AVX AVX2 F16C OPENMP"
