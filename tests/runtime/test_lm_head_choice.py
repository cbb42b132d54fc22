"""cpu_lm_head "auto": int8 rows for an untied lm_head too large to widen to fp32 here, as stored otherwise."""

import pytest
import torch

from compress.kernels import int8_rows_cpu
from compress.runtime import SamplingParams
from compress.runtime import config as engine_config
from compress.runtime.config import EngineConfig
from compress.runtime.cpu_modules import Int8Linear
from tests.conftest import save_hf, tiny_hf
from tests.runtime.conftest import make_llm


class Free:
    def __init__(self, available: int):
        self.available = available


@pytest.mark.parametrize("numel,tied,want", [(10**9, False, "int8"), (10**9, True, "stored"), (10**6, False, "stored")])
def test_auto_takes_int8_only_for_a_large_untied_lm_head(monkeypatch, numel, tied, want):
    monkeypatch.setattr(engine_config.psutil, "virtual_memory", lambda: Free(16 * 2**30))  # 4 GB fp32 > 10% of 16 GiB
    got = EngineConfig(device="cpu").resolved(torch.bfloat16, numel, tied)
    assert (got.cpu_lm_head, got.dtype) == (want, "float32")


def test_an_explicit_choice_is_kept():
    assert EngineConfig(device="cpu", cpu_lm_head="stored").resolved(torch.bfloat16, 10**12, False).cpu_lm_head == "stored"


@pytest.mark.skipif(int8_rows_cpu.load() is None, reason="no C compiler builds the int8 kernel here")
def test_auto_int8_head_is_read_as_stored_and_decodes_like_explicit_int8(tmp_path, smollm2_dir, monkeypatch):
    model = save_hf(tiny_hf("qwen3", vocab=49152).to(torch.bfloat16), tmp_path / "m", smollm2_dir)
    monkeypatch.setattr(engine_config, "LM_HEAD_SHARE", 0.0)  # every untied lm_head is "too large"
    auto = make_llm(model)
    assert auto.config.cpu_lm_head == "int8" and isinstance(auto.runner.model.lm_head, Int8Linear)
    explicit = make_llm(model, cpu_lm_head="int8")
    prompt = list(range(100, 120))
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    assert auto.generate([prompt], greedy)[0].token_ids == explicit.generate([prompt], greedy)[0].token_ids


@pytest.mark.parametrize("gguf,head,int8_activations", [
    ({"linears": "Q4_0", "output": "Q6_K"}, "int8", True),  # llama.cpp's arithmetic on that file
    ({"linears": "Q4_0", "output": "F16"}, "stored", True),  # an unquantized output layer stays as stored
    (None, "stored", False),  # any other checkpoint: as before
])
def test_auto_computes_a_gguf_read_keeping_codes_as_llama_cpp_does(gguf, head, int8_activations):
    got = EngineConfig(device="cpu").resolved(torch.float32, 10**6, True, gguf)
    assert (got.cpu_lm_head, got.cpu_int8_activations) == (head, int8_activations)


def test_explicit_choices_override_the_gguf_defaults():
    gguf = {"linears": "Q4_0", "output": "Q6_K"}
    got = EngineConfig(device="cpu", cpu_lm_head="stored", cpu_int8_activations=False).resolved(torch.float32, 10**6, True, gguf)
    assert (got.cpu_lm_head, got.cpu_int8_activations) == ("stored", False)
