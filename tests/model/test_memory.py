"""Jobs that cannot fit are refused in one line before anything is read or written."""

import pytest
import torch

from compress.errors import UserError
from compress.model import memory
from compress.model.load import open_decoder
from tests.conftest import save_hf, tiny_hf


@pytest.fixture
def src(tmp_path):
    return save_hf(tiny_hf("llama").to(torch.bfloat16), tmp_path / "src")


def params(hf) -> int:
    return sum(p.numel() for p in hf.parameters())


def test_bytes_follow_the_dtype_and_the_stored_table(src):
    model = open_decoder(src)
    n = params(tiny_hf("llama"))
    table = 256 * 64  # vocab x hidden
    assert memory.tensor_bytes(model, "", None) == 2 * n
    assert memory.model_bytes(model, torch.float32) == 4 * n - 2 * table  # the untied table stays bf16
    assert memory.model_bytes(model, torch.bfloat16) == 2 * n
    block = sum(p.numel() for p in tiny_hf("llama").model.layers[0].parameters())
    assert memory.block_bytes(model, torch.float32) == 4 * block


@pytest.fixture
def tiny_machine(monkeypatch):
    monkeypatch.setattr(memory, "available", lambda device: (10_000, "this machine has"))


def test_load_model_refuses(src, tiny_machine, monkeypatch):
    from compress import models
    from compress.model import lazy

    monkeypatch.setattr(lazy, "materialize", lambda *a, **k: pytest.fail("a tensor was read"))
    with pytest.raises(UserError, match=r"loading .* as float32 needs about 0\.0 GiB; this machine has 0\.0 GiB available"):
        models.load_model(src)


def test_quantize_refuses_and_writes_nothing(src, tiny_machine, tmp_path):
    from compress.quant.config import QuantConfig
    from compress.commands.quantize import run_quantize

    with pytest.raises(UserError, match="quantizing .* with rtn needs about"):
        run_quantize(str(src), QuantConfig(method="rtn", bits=4), str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def test_perplexity_refuses(src, tiny_machine):
    from compress.commands.evaluate import check_memory

    with pytest.raises(UserError, match="perplexity of tiny needs about"):
        check_memory(open_decoder(src), 2048, "tiny")
