"""Hub ids as MODEL: resolved from a Hugging Face cache laid out in tmp_path, never over the network."""

import socket

import pytest

from compress import hub
from compress.errors import UserError
from compress.models import resolve
from tests.conftest import run_main, save_hf, tiny_hf

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An HF cache under tmp_path holding org/tiny at COMMIT (refs main and v1), and no network."""
    root = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.delenv(hub.ALLOW_ENV, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")  # so that only our default keeps it offline

    def no_network(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    repo = root / "models--org--tiny"
    save_hf(tiny_hf("llama"), repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    for ref in ("main", "v1"):
        (repo / "refs" / ref).write_text(COMMIT)
    return root


def one_line_error(model: str) -> str:
    with pytest.raises(UserError) as e:
        resolve(model)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_hub_id_resolves_to_the_cached_snapshot(cache):
    snapshot = cache / "models--org--tiny" / "snapshots" / COMMIT
    assert resolve("org/tiny") == snapshot
    assert resolve("org/tiny@v1") == snapshot
    assert resolve(f"org/tiny@{COMMIT}") == snapshot


def test_local_directory_of_the_same_name_comes_first(cache, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save_hf(tiny_hf("llama"), tmp_path / "org" / "tiny")
    assert resolve("org/tiny").resolve() == tmp_path / "org" / "tiny"


def test_missing_id_names_the_cache_and_the_switch(cache):
    message = one_line_error("org/absent")
    assert "not in the local Hugging Face cache" in message
    assert str(cache) in message and "COMPRESS_ALLOW_DOWNLOAD=1" in message and "local" in message
    assert "'org/tiny@v2' is not a local directory and not in the local Hugging Face cache" in one_line_error("org/tiny@v2")


def test_hf_hub_offline_forbids_a_download_even_when_allowed(cache, monkeypatch):
    monkeypatch.setenv(hub.ALLOW_ENV, "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE=1 forbids downloads; set HF_HUB_OFFLINE=0" in one_line_error("org/absent")


def test_allowed_download_asks_only_for_safetensors_config_and_tokenizer(cache, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, **kw):
        calls.append((repo_id, kw))
        return str(cache / "models--org--tiny" / "snapshots" / COMMIT)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    assert resolve("org/other@dev").name == COMMIT and calls[-1][1]["local_files_only"] is True
    monkeypatch.setenv(hub.ALLOW_ENV, "1")
    resolve("org/other@dev")
    repo_id, kw = calls[-1]
    assert (repo_id, kw["revision"], kw["local_files_only"], kw["cache_dir"]) == ("org/other", "dev", False, cache)
    assert "*.safetensors" in kw["allow_patterns"] and not any(p.endswith((".bin", ".pt", ".pth")) for p in kw["allow_patterns"])


@pytest.mark.parametrize("model", ["org/na me", "org/name@", "org/-name", "org--x/name", "org/na..me", "org/name@../x"])
def test_malformed_id_is_one_line(cache, model):
    assert "is not a Hugging Face model id" in one_line_error(model)


def test_paths_are_not_taken_for_ids(cache):
    for model in ("./org/absent", "/org/absent", "a/b/c", "absent.gguf", "absent"):
        assert "not found" in one_line_error(model)


def test_snapshot_without_safetensors_is_refused(cache):
    snapshot = cache / "models--org--pickled" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((cache / "models--org--tiny" / "snapshots" / COMMIT / "config.json").read_text())
    (snapshot / "pytorch_model.bin").write_bytes(b"")
    (cache / "models--org--pickled" / "refs").mkdir()
    (cache / "models--org--pickled" / "refs" / "main").write_text(COMMIT)
    message = one_line_error("org/pickled")
    assert "lacks its safetensors weights" in message and "COMPRESS_ALLOW_DOWNLOAD=1" in message


def test_cli_error_is_one_line_with_exit_code_2(cache, monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "info", "org/absent")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not in the local Hugging Face cache" in err
