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


# Where each installed package's source lives (pyproject.toml maps kernels/ and eval/ into compress).
PACKAGE_DIRS = {"compress": ROOT / "compress", "compress.kernels": ROOT / "kernels", "compress.eval": ROOT / "eval"}
# Import cycles among compress modules that are known and not yet broken, as sorted module lists. Keep it empty.
KNOWN_CYCLES: list[list[str]] = []


def package_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the installed package (a package is its __init__.py)."""
    mods = {}
    for pkg, folder in PACKAGE_DIRS.items():
        for path in sorted(folder.rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            mods[".".join((pkg, *parts))] = path
    return mods


def imported_modules(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """The compress modules ``name`` imports anywhere in its source (module level and inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, one level up per extra dot
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names}
    out = set()
    for target in found:
        while target and target not in mods:  # `import compress.x.y` of a name inside a module: that module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)
    return out


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def cycle_path(graph: dict[str, set[str]], comp: list[str]) -> str:
    """One closed import path through ``comp``, for the failure message: a -> b -> ... -> a."""
    start, members = comp[0], set(comp)
    paths = {start: [start]}
    todo = [start]
    while todo:  # breadth-first from start until an edge leads back to it
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return " -> ".join(paths[v] + [start])
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return ", ".join(comp)


def test_import_graph_walks_the_mapped_packages():
    mods = package_modules()
    assert {"compress.cli", "compress.quant.apply", "compress.kernels", "compress.kernels.reference", "compress.eval.harness"} <= set(mods)
    assert "compress.quant.swap" in imported_modules("compress.quant.apply", mods["compress.quant.apply"], mods)


def test_no_import_cycles_among_compress_modules():
    """Module-level and function-level imports both count: a deferred import hides a circle, it does not break it."""
    mods = package_modules()
    graph = {name: imported_modules(name, path, mods) for name, path in mods.items()}
    new = [c for c in import_cycles(graph) if c not in KNOWN_CYCLES]
    assert not new, "import cycles: " + "; ".join(cycle_path(graph, c) for c in new)


def test_only_the_cli_imports_the_benchmarks():
    """compress/bench/ measures the rest and imports it one way; nothing it measures imports it back."""
    mods = package_modules()
    for name, path in mods.items():
        if name == "compress.cli" or name.startswith("compress.bench"):
            continue
        assert not any(n.startswith("compress.bench") for n in imported_modules(name, path, mods)), name


def test_cycle_finder_reports_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert import_cycles(graph) == [["a", "b", "c"]]
    assert cycle_path(graph, ["a", "b", "c"]) == "a -> b -> c -> a"
