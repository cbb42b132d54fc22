"""Outputs are built in a hidden sibling directory and renamed into place only when complete."""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from compress.errors import UserError


def check_writable(out: str | Path, option: str = "-o") -> None:
    """Fail in one line, before any work, when ``out`` (the value of ``option``) cannot be created: an empty name,
    or a nearest existing parent that is a file or where nothing can be written (tried with a directory made and removed)."""
    if not str(out).strip():
        raise UserError(f"{option} is empty; give the path of the directory to write")
    parent = Path(out).expanduser().absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{option} {out}: {parent} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".compress-probe-", dir=parent))
    except OSError as e:
        raise UserError(f"{option} {out}: cannot write in {parent} ({e.strerror})") from None


def check_target(out: str | Path, force: bool) -> None:
    check_writable(out)
    out = Path(out).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is a file; choose another -o")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} exists and is not empty; pass --force to replace it")


@contextmanager
def staged(out: Path, force: bool = False):
    """Yield a temporary directory that becomes ``out`` when the block finishes without error."""
    out = Path(out).expanduser()
    check_target(out, force)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
    except OSError as e:
        raise UserError(f"cannot create {out}: {e.strerror} ({e.filename})") from None
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
