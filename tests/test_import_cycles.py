"""No import circles anywhere in the project: module-level imports, imports inside functions and
type-only (`if TYPE_CHECKING:`) imports all count.

import-linter's contracts (pyproject.toml) say which package may import which; they do not
forbid a circle inside one layer, and an import inside a function hides one from a reader and
from the layers alike (issue 19 found three that way). A circle means two modules that can only
be understood, tested and moved together; the fix is the piece both need, in a lower module.

The graph is read from the source with `ast`, every import statement wherever it stands, so a
lazy or type-only import cannot hide an edge. `from pkg import name` is an edge to `pkg.name`
when that is a module, else to `pkg` itself (a package `__init__` that re-exports names from its
submodules, imported back through the package by one of them, is a circle too).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Every package of the project, with the directory its top-level name lives in.
PACKAGES: Mapping[str, Path] = {
    "gputopo": ROOT,
    "deviceplugin": ROOT,
    "scheduler": ROOT,
    "kubectl_gputopo": ROOT,
    "gputopo_kube": ROOT,
    "gputopo_proto": ROOT / "proto",
    "tests": ROOT,
}


def modules(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the packages."""
    out: dict[str, Path] = {}
    for name, base in packages.items():
        for path in sorted((base / name).rglob("*.py")):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The project modules `name` imports anywhere in its file."""
    known = set(known)
    is_package = path.name == "__init__.py"
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:  # `import a.b.c` of a name, not a module
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                here = name if is_package else name.rpartition(".")[0]
                for _ in range(node.level - 1):
                    here = here.rpartition(".")[0]
                base = f"{here}.{node.module}" if node.module else here
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in known else base)
    return out


def graph(packages: Mapping[str, Path]) -> dict[str, set[str]]:
    found = modules(packages)
    return {name: imports_of(name, path, found) for name, path in found.items()}


def circles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            step = next(it, None)
            if step is not None:
                if step not in edges:
                    continue
                if step not in index:
                    index[step] = low[step] = counter
                    counter += 1
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(edges[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_project_has_no_import_circles() -> None:
    edges = graph(PACKAGES)
    assert "gputopo.node.allocator" in edges and "scheduler.extender" in edges  # the walk saw the tree
    found = circles(edges)
    described = [
        " -> ".join(c) + "; edges: " + ", ".join(f"{a}->{b}" for a in c for b in sorted(edges[a]) if b in c)
        for c in found
    ]
    assert not found, "import circles:\n" + "\n".join(described)


def _write(base: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_a_circle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": "B = 1\n\ndef late():\n    from pkg import a\n    return a\n",
        },
    )
    assert circles(graph({"pkg": tmp_path})) == [["pkg.a", "pkg.b"]]


def test_a_circle_through_a_type_only_import_is_found(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import B\n",
            "pkg/b.py": (
                "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.a import A\n\nB = 1\n"
            ),
        },
    )
    assert circles(graph({"pkg": tmp_path})) == [["pkg.a", "pkg.b"]]


def test_a_package_face_imported_back_through_the_package_is_a_circle(tmp_path: Path) -> None:
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from pkg.core import Thing\n",
            "pkg/core.py": "class Thing: ...\n",
            "pkg/user.py": "from pkg import Thing\n",
            "pkg/rel.py": "from . import user\n",
        },
    )
    edges = graph({"pkg": tmp_path})
    assert edges["pkg.user"] == {"pkg"} and edges["pkg.rel"] == {"pkg.user"}
    assert circles(edges) == []  # user -> pkg -> core: no way back
    _write(tmp_path, {"pkg/core.py": "from pkg.user import Thing as _T\n\nclass Thing: ...\n"})
    assert circles(graph({"pkg": tmp_path})) == [["pkg", "pkg.core", "pkg.user"]]
