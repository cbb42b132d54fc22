"""Hugging Face hub ids as MODEL: `org/name` or `org/name@revision`, through the local HF cache.

Offline by default: a snapshot already in the Hugging Face cache (`hf download`, transformers or
vLLM put it there) is used as is, and nothing touches the network. A download happens only when
COMPRESS_ALLOW_DOWNLOAD=1 is set, and never under HF_HUB_OFFLINE=1. Only what we load is fetched:
top-level config and tokenizer files and safetensors weights; never pickles (*.bin, *.pt), never
`original/` or Mistral's duplicate `consolidated.safetensors`.
"""

import json
import os
import re
from pathlib import Path

from compress.errors import UserError

ALLOW_ENV = "COMPRESS_ALLOW_DOWNLOAD"
ALLOW_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "merges.txt", "vocab.txt"]
IGNORE_PATTERNS = ["*/*", "consolidated*"]  # fnmatch's * crosses "/": this keeps top-level files only
# The hub's rule for a repo id: letters, digits, "-", "_", "." (no "--" or ".." inside, no edge "-"/"."), <= 96 chars.
PART = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{PART}/{PART}")
REVISION = re.compile(r"[A-Za-z0-9_./-]+")  # a branch, tag or commit; refs/pr/1 has slashes
TRUE = ("1", "true", "yes", "on")


def looks_like_id(model: str) -> bool:
    """`org/name[@rev]` that is not meant as a path (no leading '/', '.', '~'; one slash before '@')."""
    repo = model.split("@", 1)[0]
    return repo.count("/") == 1 and not model.startswith(("/", ".", "~")) and not model.endswith(".gguf")


def parse(model: str) -> tuple[str, str]:
    """'org/name@rev' -> ('org/name', 'rev'); the revision defaults to 'main'."""
    repo, _, revision = model.partition("@")
    bad_repo = not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo or len(repo) > 96
    bad_revision = "@" in model and (not REVISION.fullmatch(revision) or ".." in revision)
    if bad_repo or bad_revision:
        raise UserError(f"'{model}' is not a Hugging Face model id: write org/name or org/name@revision "
                        f"(letters, digits, '-', '_', '.'), or give a local directory")
    return repo, revision or "main"


def cache_dir() -> Path:
    """Where huggingface_hub keeps snapshots, read from the environment now (not at import)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(os.environ.get("HF_HOME", xdg / "huggingface")).expanduser() / "hub"


def downloads_allowed() -> bool:
    return (os.environ.get(ALLOW_ENV, "").lower() in TRUE
            and os.environ.get("HF_HUB_OFFLINE", "").lower() not in TRUE)


def how_to_download() -> str:
    if os.environ.get(ALLOW_ENV, "").lower() not in TRUE:
        return f"set {ALLOW_ENV}=1 to download it (or run `hf download` first)"
    return f"{ALLOW_ENV}=1 is set but HF_HUB_OFFLINE=1 forbids downloads; set HF_HUB_OFFLINE=0 as well"


def snapshot(model: str) -> Path:
    """A hub id -> its snapshot directory in the HF cache (downloaded only when allowed)."""
    repo, revision = parse(model)
    online = downloads_allowed()
    path = fetch(repo, revision, online)
    check_weights(path, model, online)
    return path


def fetch(repo: str, revision: str, online: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    label = repo if revision == "main" else f"{repo}@{revision}"
    try:
        return Path(snapshot_download(repo, revision=revision, cache_dir=cache_dir(), local_files_only=not online,
                                      allow_patterns=ALLOW_PATTERNS, ignore_patterns=IGNORE_PATTERNS))
    except LocalEntryNotFoundError as e:
        if type(e).__name__ == "IncompleteSnapshotError":  # huggingface_hub >= 1.x knows a snapshot is partial
            raise UserError(f"the cached snapshot of {label} is incomplete: {how_to_download()}") from None
        if online:
            raise UserError(f"could not download {label} and it is not in the local Hugging Face cache "
                            f"({cache_dir()}): {first_line(e)}") from None
        raise UserError(f"model '{label}' is not a local directory and not in the local Hugging Face cache "
                        f"({cache_dir()}): {how_to_download()}, or give a local HF model directory") from None
    except GatedRepoError:
        raise UserError(f"{repo} is gated: accept its license on huggingface.co and log in (`hf auth login`)") from None
    except RevisionNotFoundError:
        raise UserError(f"{repo} has no revision '{revision}' on the hub") from None
    except RepositoryNotFoundError:
        raise UserError(f"no model {repo} on the hub (if it is private, log in with `hf auth login`)") from None
    except (OSError, ValueError) as e:
        raise UserError(f"could not fetch {label}: {first_line(e)}") from None


def check_weights(path: Path, model: str, online: bool) -> None:
    """The snapshot must hold safetensors weights, every shard of an index among them."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [s for s in shards if not (path / s).is_file()]
    else:
        missing = [] if any(path.glob("*.safetensors")) else ["*.safetensors"]
    if not missing:
        return
    if online:
        raise UserError(f"{model} has no safetensors weights on the hub ({', '.join(missing[:3])} missing); "
                        f"pickle weights (*.bin, *.pt) are never loaded: convert them and give a local directory")
    raise UserError(f"the cached snapshot of {model} at {path} lacks its safetensors weights "
                    f"({', '.join(missing[:3])}): {how_to_download()}")


def first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
