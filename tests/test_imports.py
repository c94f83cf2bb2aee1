"""The package's import graph: no circles, private modules stay home, __init__s only re-export.

Imports are read from the source (``ast``), so lazy ones count too: imports inside
functions, under ``TYPE_CHECKING``, and, in modules that use ``importlib``, module names
given as strings to be imported later (tables of lazy commands or attributes).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "r3store"

OPTIONAL = ("torch", "torchdata", "s3fs", "botocore", "aiobotocore", "aiohttp", "matplotlib", "transformers", "ray",
            "megatron", "moto", "pytest", "hypothesis", "trl")
"""Extras (and test tools) that ``import r3store`` must not import."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    """The r3store module imported (a submodule when ``from package import submodule``)."""
    names: tuple[str, ...]
    """Names taken from it (``from target import names``); empty for ``import target``."""
    line: int
    lazy: bool

    def __str__(self) -> str:
        what = f"from {self.target} import {', '.join(self.names)}" if self.names else f"import {self.target}"
        return f"{self.importer}:{self.line}: {what}{' (lazy)' if self.lazy else ''}"


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def imports_of(importer: str) -> Iterator[Import]:
    """Every import of an r3store module by ``importer``, eager or lazy."""
    tree = ast.parse(MODULES[importer].read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    docstrings = _docstrings(tree)
    uses_importlib = any((isinstance(n, ast.Import) and any(a.name == "importlib" for a in n.names))
                         or (isinstance(n, ast.ImportFrom) and n.module == "importlib") for n in ast.walk(tree))
    for node in ast.walk(tree):
        lazy = id(node) not in top_level
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "r3store":
                    yield Import(importer, alias.name, (), node.lineno, lazy)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(importer, node)
            if module.split(".")[0] != "r3store":
                continue
            subs = tuple(a.name for a in node.names if f"{module}.{a.name}" in MODULES)
            for name in subs:
                yield Import(importer, f"{module}.{name}", (), node.lineno, lazy)
            rest = tuple(a.name for a in node.names if a.name not in subs)
            if rest:
                yield Import(importer, module, rest, node.lineno, lazy)
        elif uses_importlib and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and id(node) not in docstrings:
            name = node.value.partition(":")[0]  # "module" or "module:attribute"
            if name in MODULES and name != importer and name.startswith("r3store."):
                yield Import(importer, name, (), node.lineno, True)


ALL_IMPORTS = [imp for module in MODULES for imp in imports_of(module)]


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node, or a self-loop (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in edges.get(v, ()):
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def _unit(module: str) -> str:
    """The package-level unit of a module: ``r3store.<top>`` (a subpackage or top-level module)."""
    return ".".join(module.split(".")[:2])


def test_the_graph_is_read() -> None:
    """Guards the test itself: the graph holds the imports we know exist, lazy ones too."""
    edges = {(imp.importer, imp.target, imp.lazy) for imp in ALL_IMPORTS}
    assert ("r3store.batch._assemble", "r3store.reader", False) in edges
    assert ("r3store._store", "r3store.dataset", True) in edges  # return_tensors="pt"
    assert ("r3store.cli._main", "r3store.cli._inspect", True) in edges  # lazy command table
    assert len(MODULES) > 60


def test_no_import_circle_between_modules() -> None:
    edges: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        edges.setdefault(imp.importer, set()).add(imp.target)
    cycles = _cycles(edges)
    where = {c: [str(i) for i in ALL_IMPORTS if i.importer in c and i.target in c] for c in map(tuple, cycles)}
    assert not cycles, f"import circles: {where}"


def test_no_import_circle_between_packages() -> None:
    """Collapsing each subpackage (and top-level module) to one node, the flow is still one way."""
    edges: dict[str, set[str]] = {}
    for imp in ALL_IMPORTS:
        a, b = _unit(imp.importer), _unit(imp.target)
        if a != b:
            edges.setdefault(a, set()).add(b)
    cycles = _cycles(edges)
    where = {tuple(c): [str(i) for i in ALL_IMPORTS if _unit(i.importer) in c and _unit(i.target) in c
                        and _unit(i.importer) != _unit(i.target)] for c in cycles}
    assert not cycles, f"package circles: {where}"


def _owner(module: str) -> str | None:
    """The package a private module belongs to: the parent of its first ``_name`` component."""
    parts = module.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_private_modules_stay_inside_their_package() -> None:
    """``a.b._c`` is imported only from inside ``a.b``; the CLI uses only public modules outside it."""
    bad = []
    for imp in ALL_IMPORTS:
        owner = _owner(imp.target)
        if owner is None:
            continue
        inside = imp.importer == owner or imp.importer.startswith(owner + ".")
        cli_reaching_out = imp.importer.startswith("r3store.cli") and not imp.target.startswith("r3store.cli.")
        if not inside or cli_reaching_out:
            bad.append(str(imp))
    assert not bad, "private modules imported from outside their package:\n" + "\n".join(bad)


def test_no_private_name_is_imported_from_another_module() -> None:
    bad = [str(imp) for imp in ALL_IMPORTS
           if any(n.startswith("_") and not n.startswith("__") for n in imp.names)]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if p.name == "__init__.py"))
def test_package_inits_only_re_export(module: str) -> None:
    """Imports, a sorted ``__all__`` of names bound there (or lazily by ``__getattr__``), no code of their own."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    defined = [n.name for n in tree.body if isinstance(n, ast.ClassDef | ast.FunctionDef) and n.name != "__getattr__"]
    assert not defined, f"{module} defines {defined}: move them to a module of the package"
    names = next(ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))
    assert names == sorted(names), f"{module}.__all__ is not sorted"
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom | ast.Import) for a in n.names}
    lazy = any(isinstance(n, ast.FunctionDef | ast.Assign) and "__getattr__" in ast.dump(n) for n in tree.body)
    missing = [n for n in names if n not in imported and n != "__version__"]
    assert not missing or lazy, f"{module}.__all__ names {missing} that it does not import"


def test_importing_r3store_imports_no_optional_dependency() -> None:
    code = ("import sys, r3store, r3store.reader, r3store.writer, r3store.batch, r3store.layout, r3store.audit, "
            "r3store.storage, r3store.codecs, r3store.cli\n"
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r})\n"
            "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_subpackages_are_reachable_after_a_plain_import() -> None:
    """README snippets write ``import r3store`` then ``r3store.layout.LayoutOptions(...)``."""
    code = ("import sys, r3store\n"
            "assert r3store.layout.LayoutOptions(cp_size=2, cp_rank=1).cp_rank == 1\n"
            "assert callable(r3store.batch.assemble) and callable(r3store.reader.open_reader)\n"
            "assert 'torch' not in sys.modules  # layout/batch/reader need no torch\n"
            "try:\n    r3store.nonexistent\nexcept AttributeError:\n    pass\nelse:\n    raise SystemExit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_r3store_ray_without_ray_names_the_extra() -> None:
    code = ("import sys\nsys.modules['ray'] = None  # as if ray were not installed\n"
            "try:\n    import r3store.ray\nexcept ImportError as exc:\n"
            "    assert \"pip install 'r3store[ray]'\" in str(exc), exc\nelse:\n    raise SystemExit(1)\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
