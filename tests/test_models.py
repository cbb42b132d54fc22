import pytest

from compress import models
from compress.gguf import reader


def fake_convert(also_finished: bool):
    """A reader.convert that writes config.json; ``also_finished``: another process's result appears meanwhile."""

    def convert(gguf, out_dir, keep_codes=True):
        (out_dir / "config.json").write_text("{\"ours\": true}")
        if also_finished:
            other = out_dir.parent / "m"
            other.mkdir()
            (other / "config.json").write_text("{\"ours\": false}")
            (other / "model.safetensors").write_bytes(b"x")

    return convert


def test_converted_once_then_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    monkeypatch.setattr(reader, "convert", fake_convert(False))
    out = models.converted(tmp_path / "m.gguf", "m")
    assert (out / "config.json").read_text() == "{\"ours\": true}"
    monkeypatch.setattr(reader, "convert", lambda *a: pytest.fail("converted twice"))
    assert models.converted(tmp_path / "m.gguf", "m") == out


def test_concurrent_conversion_keeps_the_first_and_cleans_up(tmp_path, monkeypatch):
    monkeypatch.setenv("COMPRESS_CACHE", str(tmp_path))
    monkeypatch.setattr(reader, "convert", fake_convert(True))
    out = models.converted(tmp_path / "m.gguf", "m")
    assert (out / "config.json").read_text() == "{\"ours\": false}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]  # no temporary directory left behind
