"""Outputs are built in a hidden sibling directory and renamed into place only when complete."""

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from compress.errors import UserError


def check_target(out: Path, force: bool) -> None:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is a file; choose another -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} exists and is not empty; pass --force to replace it")


@contextmanager
def staged(out: Path, force: bool = False):
    """Yield a temporary directory that becomes ``out`` when the block finishes without error."""
    out = Path(out).expanduser()
    check_target(out, force)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
