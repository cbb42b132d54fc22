"""Intel's AutoRound (PyPI `auto-round` 0.14), run in its own virtual environment, for the comparison scripts.

AutoRound pins other versions of transformers' companions than ours, so it lives in a venv of its own
(docs/autoround.md gives the commands) and runs as a child process of its CLI:

    python3 -m venv /work/autoround-venv
    /work/autoround-venv/bin/pip install torch==2.13.0
    /work/autoround-venv/bin/pip install 'auto-round==0.14.*' 'torch==2.13.0' requests gguf sentencepiece

`autoround_python()` finds that venv ($COMPRESS_AUTOROUND_PYTHON, default /work/autoround-venv/bin/python);
`calibration_file()` writes our own calibration rows as the local .jsonl AutoRound reads; `run_autoround()`
quantizes a local HF directory on the CPU and returns what it wrote and the wall seconds.
"""

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from compress.errors import UserError

DEFAULT_PYTHON = "/work/autoround-venv/bin/python"
SETUP = "docs/autoround.md"
MARGIN = 16  # extra tokens per calibration row, so that re-tokenizing its text still gives at least seqlen


def autoround_python() -> Path:
    """The venv's python; one line naming the variable and the setup page when it is missing."""
    python = Path(os.environ.get("COMPRESS_AUTOROUND_PYTHON", DEFAULT_PYTHON)).expanduser()
    if not python.is_file():
        raise UserError(f"AutoRound's python {python} not found: create its venv as {SETUP} says, or set "
                        "COMPRESS_AUTOROUND_PYTHON to a python that imports auto_round")
    return python


def calibration_file(tokenizer, path: Path, nsamples: int, seqlen: int, seed: int = 0) -> Path:
    """Our calibration rows (compress.calib.calibration_tokens: shuffled C4 documents, concatenated, cut into rows) as
    AutoRound's local .jsonl, one {"text"} a row. AutoRound tokenizes each line, drops lines under seqlen tokens and
    cuts the rest to seqlen (its ":concat" option fails on local files in 0.14.2), so each line is the row's text plus
    MARGIN tokens of the next: re-tokenized and cut, it gives our row up to the re-tokenization of its last word."""
    from compress.calib import calibration_tokens

    cfg = SimpleNamespace(calib_data=None, seed=seed, calib_samples=nsamples + 1, calib_seq_len=seqlen)
    flat = calibration_tokens(tokenizer, cfg).flatten()
    lines = [json.dumps({"text": tokenizer.decode(flat[i * seqlen:(i + 1) * seqlen + MARGIN])}) for i in range(nsamples)]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def command(python: Path, src_dir: Path, out_dir: Path, fmt: str, iters: int, nsamples: int, seqlen: int,
            calib_file: Path, scheme: tuple[str, ...] = ()) -> list[str]:
    """AutoRound's CLI on the CPU: ``fmt`` "gguf:q4_0", "gguf:q4_k_m", "gguf:q8_0"..., "auto_round" (its default
    W4A16: symmetric int4, group 128) or "fake" (the dequantized weights as a plain checkpoint); iters 0 is its RTN
    mode (with an importance-weighted rounding search of its own). ``scheme``: more of its flags, e.g.
    ("--bits", "4", "--group_size", "64", "--asym")."""
    return [str(python), "-m", "auto_round", "--model", str(src_dir), "--format", fmt, "--iters", str(iters),
            "--nsamples", str(nsamples), "--seqlen", str(seqlen), "--dataset", str(calib_file), "--device", "cpu",
            "--output_dir", str(out_dir), *scheme]


def written(out_dir: Path, fmt: str) -> Path:
    """The .gguf file AutoRound wrote under out_dir (gguf formats), else the directory holding its config.json."""
    pattern = "*.gguf" if fmt.startswith("gguf") else "config.json"
    found = sorted(Path(out_dir).rglob(pattern))
    if not found:
        raise UserError(f"AutoRound wrote no {pattern} under {out_dir}")
    return found[0] if fmt.startswith("gguf") else found[0].parent


def environment() -> dict[str, str]:
    """Offline, and without our PYTHONPATH: the repo's kernels/ folder would shadow the `kernels` package that
    transformers probes for."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def run_autoround(src_dir: Path, out_dir: Path, fmt: str, iters: int, nsamples: int, seqlen: int,
                  calib_file: Path, scheme: tuple[str, ...] = ()) -> tuple[Path, float]:
    """Quantize ``src_dir`` with AutoRound into ``out_dir`` (replaced when complete); returns (the written .gguf file or
    model directory, wall seconds of the child process). Its output is staged in a sibling temporary directory and
    the child runs from a neutral working directory (a checkout's kernels/ would shadow transformers' probe)."""
    cmd_python = autoround_python()
    out_dir = Path(out_dir).expanduser().absolute()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        cmd = command(cmd_python, Path(src_dir).absolute(), tmp, fmt, iters, nsamples, seqlen, Path(calib_file).absolute(),
                      scheme)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=tmp, env=environment())
        seconds = time.perf_counter() - start
        if done.returncode != 0:
            raise UserError(f"AutoRound exited with {done.returncode}: {' '.join(cmd)}")
        relative = written(tmp, fmt).relative_to(tmp)
        shutil.rmtree(out_dir, ignore_errors=True)
        tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir / relative, seconds
