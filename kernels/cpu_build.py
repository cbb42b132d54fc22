"""Build a C source into a shared library with the machine's C compiler, cached per source and CPU.
Imports only the standard library.

The CPU kernels (``*_cpu.py``) are small C functions called through ctypes: no Python extension
build, no new package, only a C compiler (``$CC``, else ``cc`` or ``gcc``) at first use. Where none
works, or with ``COMPRESS_CPU_KERNELS=0``, ``load`` returns None and callers run torch ops.

Vector width: every source starts with ``PREAMBLE``, which picks the widest vectors the target has
(16 floats with AVX-512, 8 with AVX/AVX2, 4 on NEON and anything else). ``COMPRESS_CPU_ISA=avx2``
builds without AVX-512 and AVX-VNNI on an AVX-512 host: the other x86 path, for tests and
comparisons; the library is cached apart from the native one.
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
# GCC and Clang vectorize loops 256 bits wide even where AVX-512 is there unless asked; the flag is x86-only.
X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
WIDE = ["-mprefer-vector-width=512"] if X86 else []
# COMPRESS_CPU_ISA: extra flags on top of -march=native; "avx2" is an AVX2-only host (no AVX-512, no AVX-VNNI)
ISAS = {"native": [], "avx2": ["-mno-avx512f", "-mno-avxvnni"]}

PREAMBLE = r"""
#include <stddef.h>
#if defined(__AVX512F__)
#define VW 16
#elif defined(__AVX__)
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));
typedef float vfu __attribute__((vector_size(VW * 4), aligned(4)));  /* an unaligned load or store */

static inline float hsum(vf v) {
    float s = 0.f;
    for (int l = 0; l < VW; l++) s += v[l];
    return s;
}

int vector_width(void) { return VW; }  /* floats per vector in this build (tests, reports) */

/* Ask for the line at p in each of rows ahead .. ahead + rn - 1 past p's row, rows stride bytes apart. A kernel
   walking a few short weight rows side by side makes short streams that the hardware prefetchers pick up late
   (docs/kernels.md, "Prefetching"); a prefetch never faults, so rows past the matrix's end cost nothing. */
static inline void prefetch_rows(const void *p, size_t stride, int rn, int ahead) {
    for (int n = 0; n < rn; n++) __builtin_prefetch((const char *)p + (size_t)(n + ahead) * stride);
}

/* Whole rn-row blocks of W to each thread, a contiguous share: [o0, o1) of O for thread t. */
static inline void share(int O, int rn, int t, int threads, int *o0, int *o1) {
    const int blocks = (O + rn - 1) / rn;
    *o0 = (int)((long)blocks * t / threads) * rn;
    *o1 = (int)((long)blocks * (t + 1) / threads) * rn;
    if (*o1 > O) *o1 = O;
}
"""


def cache_dir() -> Path:
    # The same root as compress.models.cache_dir (kernels import nothing from compress).
    return Path(os.environ.get("COMPRESS_CACHE", Path.home() / ".cache" / "compress")) / "kernels"


def isa() -> str:
    """The build variant COMPRESS_CPU_ISA asks for (default "native")."""
    name = os.environ.get("COMPRESS_CPU_ISA", "native")
    if name not in ISAS:
        raise ValueError(f"COMPRESS_CPU_ISA must be one of {', '.join(ISAS)}, got {name!r}")
    return name


def flags() -> list[str]:
    """The compiler flags of this process's builds (OpenMP added where the compiler has it)."""
    return [*FLAGS, *WIDE, *ISAS[isa()]]


def machine() -> str:
    """What -march=native compiles for: a library built on one CPU must not load on another."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = [line for line in cpuinfo.read_text().splitlines() if line.startswith(("flags", "Features"))]
        return platform.machine() + (flags[0] if flags else "")
    return platform.machine() + platform.processor()


def _compile(cc: str, source: str, target: Path, build_flags: list[str]) -> bool:
    """Build into a temporary file and move it into place: never a half-written library."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        src, lib = Path(tmp) / "kernel.c", Path(tmp) / target.name
        src.write_text(source)
        for extra in (OPENMP, []):  # a compiler without OpenMP still builds a one-thread kernel
            if subprocess.run([cc, *build_flags, *extra, str(src), "-o", str(lib)], capture_output=True).returncode == 0:
                os.replace(lib, target)
                return True
    return False


def load(name: str, source: str, symbols: dict[str, tuple[list, object]]) -> ctypes.CDLL | None:
    """The library built from ``PREAMBLE + source`` (built now unless cached), each function of
    ``symbols`` typed as ``{name: (argtypes, restype)}``; None where it cannot be built."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if os.environ.get("COMPRESS_CPU_KERNELS", "1") == "0" or cc is None:
        return None
    source, build_flags = PREAMBLE + source, flags()
    key = hashlib.sha256("\0".join([source, *build_flags, cc, machine()]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{name}-{key}.so"
    if not path.exists() and not _compile(cc, source, path, build_flags):
        return None
    lib = ctypes.CDLL(str(path))
    for symbol, (argtypes, restype) in symbols.items():
        fn = getattr(lib, symbol)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def require(lib: ctypes.CDLL | None) -> ctypes.CDLL:
    """``lib``, or a clear error where it could not be built (callers check ``supports`` first)."""
    if lib is None:
        raise RuntimeError("the CPU kernel cannot be built here (no working C compiler, or COMPRESS_CPU_KERNELS=0)")
    return lib
