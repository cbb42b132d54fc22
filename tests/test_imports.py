"""The import rules of DESIGN.md, checked on the source (no module is imported)."""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]
STDLIB = set(sys.stdlib_module_names)


def imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module)
    return names


def third_party(names: set[str]) -> set[str]:
    return {n for n in names if n.split(".")[0] not in STDLIB}


def test_pure_modules_import_only_torch_and_triton():
    pure = [ROOT / "compress/quant/primitives.py", ROOT / "compress/quant/packing.py", *sorted((ROOT / "kernels").glob("*.py"))]
    for path in pure:
        allowed = {"torch", "triton", "compress"} if path.parent.name == "kernels" else {"torch"}
        for name in third_party(imports(path)):
            top = name.split(".")[0]
            assert top in allowed, f"{path.name} imports {name}"
            if top == "compress":  # kernels may only import each other
                assert name.startswith("compress.kernels"), f"{path.name} imports {name}"


def test_compression_never_imports_the_runtime():
    for sub in ("quant", "prune"):
        for path in sorted((ROOT / "compress" / sub).glob("*.py")):
            assert not any(n.startswith("compress.runtime") for n in imports(path)), path.name


def test_runtime_never_imports_the_searches():
    searches = ("compress.quant.awq", "compress.quant.awq_apply", "compress.calib", "compress.prune")
    for path in sorted((ROOT / "compress" / "runtime").glob("*.py")):
        assert not any(n.startswith(searches) for n in imports(path)), path.name
