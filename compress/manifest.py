"""compress.json: what made an output directory, from what, and how good it is."""

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

MANIFEST = "compress.json"
VERSIONED = ("compress", "torch", "transformers", "safetensors", "compressed-tensors", "lm-eval")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict:
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


def write_manifest(out_dir: Path, **fields) -> dict:
    """Write compress.json with ``fields`` plus tool versions and a sha256 per file."""
    out_dir = Path(out_dir)
    files = {p.name: sha256(p) for p in sorted(out_dir.iterdir()) if p.is_file() and p.name != MANIFEST}
    doc = {**fields, "versions": versions(), "sha256": files}
    save_manifest(out_dir, doc)
    return doc


def save_manifest(model_dir: Path, doc: dict) -> None:
    (Path(model_dir) / MANIFEST).write_text(json.dumps(doc, indent=2, default=str))


def read_manifest(model_dir: Path) -> dict | None:
    path = Path(model_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def record_quality(model_dir: Path, key: str, value) -> None:
    """Merge one measured number into an existing compress.json (no-op for other directories)."""
    doc = read_manifest(model_dir)
    if doc is None:
        return
    doc.setdefault("quality", {})[key] = value
    save_manifest(model_dir, doc)
