"""The import graph of gpuir: no circles, no private names across modules, layers import only downward.

Every ``import`` of every module is read with :mod:`ast` -- those inside functions
too, so a function-local import cannot hide a circle. The rules:

* no cycle among gpuir's modules (a package's ``__init__`` counts as a module);
* no ``from gpuir.x import _name`` of a private name defined in another module;
* the layers: ``storage`` imports nothing of gpuir but itself and ``_compat``; ``index`` never
  imports ``backends`` or ``memory``; ``memory`` never imports ``retrieve``, ``service`` or the
  command-line clients; ``retrieve`` never imports ``service``; nothing outside ``gpuir.eval``
  imports ``gpuir.eval``, except the command-line clients above the library (``gpuir.cli``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "gpuir"


def _modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (p, is_pkg)
    return out


MODULES = _modules()


def _imports() -> list[tuple[str, str, str | None, int]]:
    """(importer, imported module, imported name or None, line) of every gpuir import."""
    out = []
    for mod, (path, is_pkg) in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out += [(mod, a.name, None, node.lineno) for a in node.names if a.name.startswith("gpuir")]
            elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                if not target.startswith("gpuir"):
                    continue
                for a in node.names:
                    sub = f"{target}.{a.name}"
                    if sub in MODULES:  # "from . import kernels": the module gpuir.x.kernels
                        out.append((mod, sub, None, node.lineno))
                    else:
                        out.append((mod, target, a.name, node.lineno))
    return out


IMPORTS = _imports()


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for src, dst, _, _ in IMPORTS:
        if dst in MODULES and dst != src:
            edges[src].add(dst)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on, stack, out = set(), [], []
    counter = 0
    for root, targets in edges.items():
        if root in index:
            continue
        work = [(root, iter(sorted(targets)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _in(mod: str, pkg: str) -> bool:
    return mod == pkg or mod.startswith(pkg + ".")


def test_the_walker_sees_the_package():
    assert {"gpuir.retrieve.retriever", "gpuir.memory.store", "gpuir.storage.dirlock", "gpuir.cli"} <= set(MODULES)
    assert ("gpuir.retrieve.retriever", "gpuir.memory", "Memory") in {(a, b, c) for a, b, c, _ in IMPORTS}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the detector works


def test_no_import_cycles():
    assert _cycles(_edges()) == []


def test_no_private_names_across_modules():
    bad = [f"{src}:{line} imports {name} from {dst}" for src, dst, name, line in IMPORTS
           if name and name.startswith("_") and not name.startswith("__") and dst != src]
    assert bad == []


LAYERS = [  # (importer package, forbidden packages)
    ("gpuir.storage", ["gpuir.index", "gpuir.memory", "gpuir.service", "gpuir.retrieve", "gpuir.backends",
                       "gpuir.engine", "gpuir.dense", "gpuir.eval", "gpuir.cli", "gpuir.adapters"]),
    ("gpuir.index", ["gpuir.backends", "gpuir.memory", "gpuir.retrieve", "gpuir.service", "gpuir.cli"]),
    ("gpuir.memory", ["gpuir.retrieve", "gpuir.service", "gpuir.cli", "gpuir.adapters"]),
    ("gpuir.retrieve", ["gpuir.service", "gpuir.cli", "gpuir.adapters"]),
    ("gpuir.backends", ["gpuir.memory", "gpuir.retrieve", "gpuir.service", "gpuir.cli"]),
    ("gpuir.compat", ["gpuir.service", "gpuir.cli", "gpuir.eval", "gpuir.adapters"]),
]


@pytest.mark.parametrize(("layer", "forbidden"), LAYERS, ids=[x for x, _ in LAYERS])
def test_layers_import_only_downward(layer, forbidden):
    bad = [f"{src}:{line} imports {dst}" for src, dst, _, line in IMPORTS
           if _in(src, layer) and any(_in(dst, f) for f in forbidden)]
    assert bad == []


def test_the_library_never_imports_the_evaluation():
    bad = [f"{src}:{line} imports {dst}" for src, dst, _, line in IMPORTS
           if _in(dst, "gpuir.eval") and not _in(src, "gpuir.eval") and not _in(src, "gpuir.cli")]
    assert bad == []


#: What gpuir.memory may import of gpuir.backends (issue 34): the segment-set contract, and backend selection
#: (gpuir.backends's resolve functions and the engine routing) -- never an engine's internals.
MEMORY_MAY_IMPORT = {"gpuir.backends.contract": None,
                     "gpuir.backends": {"resolve_backend", "resolve_memory_backend", "engine_for", "segment_engine",
                                        "use_engine", "BACKENDS"}}


def _memory_backend_violations(imports) -> list[str]:
    bad = []
    for src, dst, name, line in imports:
        if not _in(src, "gpuir.memory") or not _in(dst, "gpuir.backends"):
            continue
        if dst in MEMORY_MAY_IMPORT and (MEMORY_MAY_IMPORT[dst] is None or name in MEMORY_MAY_IMPORT[dst]):
            continue
        bad.append(f"{src}:{line} imports {dst}{'.' + name if name else ''}")
    return bad


def test_the_memory_imports_no_backend_internals():
    """gpuir.memory reaches scoring only through the contract (gpuir.backends.contract) and backend selection."""
    assert _memory_backend_violations(IMPORTS) == []
    # the rule sees what it forbids: an engine module, an internal name of the package, a private helper
    fake = [("gpuir.memory.search", "gpuir.backends.numba_segments", None, 1),
            ("gpuir.memory.segments", "gpuir.backends", "make_scorer", 2),
            ("gpuir.memory.store", "gpuir.backends.cpu_segments", "first_bad_posting", 3),
            ("gpuir.memory.search", "gpuir.backends.contract", "QueryBatch", 4),
            ("gpuir.memory.store", "gpuir.backends", "resolve_memory_backend", 5)]
    assert len(_memory_backend_violations(fake)) == 3
    assert any(src.startswith("gpuir.memory") and dst == "gpuir.backends.contract" for src, dst, _, _ in IMPORTS)
