"""Build a C source into a shared library with the machine's C compiler, cached per source and CPU.
Imports only the standard library.

The CPU kernels (``*_cpu.py``) are small C functions called through ctypes: no Python extension
build, no new package, only a C compiler (``$CC``, else ``cc`` or ``gcc``) at first use. Where none
works, or with ``COMPRESS_CPU_KERNELS=0``, ``load`` returns None and callers run torch ops.
"""

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

# -ffast-math is left out on purpose: linked into a shared object it can switch the whole process
# to flush-to-zero. These flags only allow reordering sums, which lets the compiler vectorize them.
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros",
         "-shared", "-fPIC"]
OPENMP = ["-fopenmp"]


def cache_dir() -> Path:
    # The same root as compress.models.cache_dir (kernels import nothing from compress).
    return Path(os.environ.get("COMPRESS_CACHE", Path.home() / ".cache" / "compress")) / "kernels"


def _machine() -> str:
    """What -march=native compiles for: a library built on one CPU must not load on another."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = [line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))]
        return platform.machine() + (flags[0] if flags else "")
    return platform.machine() + platform.processor()


def _compile(cc: str, source: str, target: Path) -> bool:
    """Build into a temporary file and move it into place: never a half-written library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, lib = Path(tmp) / "kernel.c", Path(tmp) / target.name
        src.write_text(source)
        for extra in (OPENMP, []):  # a compiler without OpenMP still builds a one-thread kernel
            if subprocess.run([cc, *FLAGS, *extra, str(src), "-o", str(lib)], capture_output=True).returncode == 0:
                os.replace(lib, target)
                return True
    return False


def load(name: str, source: str, symbol: str, argtypes: list, restype=None) -> ctypes.CDLL | None:
    """The library built from ``source`` (built now unless cached), its function ``symbol`` typed
    with ``argtypes`` and ``restype``; None where it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if os.environ.get("COMPRESS_CPU_KERNELS", "1") == "0" or cc is None:
        return None
    key = hashlib.sha256("\0".join([source, *FLAGS, cc, _machine()]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.so"
    if not path.exists() and not _compile(cc, source, path):
        return None
    lib = ctypes.CDLL(str(path))
    fn = getattr(lib, symbol)
    fn.argtypes, fn.restype = argtypes, restype
    return lib


def require(lib: ctypes.CDLL | None) -> ctypes.CDLL:
    """``lib``, or a clear error where it could not be built (callers check ``supports`` first)."""
    if lib is None:
        raise RuntimeError("the CPU kernel cannot be built here (no working C compiler, or COMPRESS_CPU_KERNELS=0)")
    return lib
