"""The house rules of issues 20 and 38, checked over the source: no module of ``replicaft/`` or
``lighthouse/`` over 400 lines, no class over 300, and no import circle among their modules
(module-level imports; one of a package's submodules, ``from pkg import mod``, counts as an
import of that submodule, not of the package), and nothing at the top of either package but
its public surface."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO_ROOT

PACKAGES = ("replicaft", "lighthouse")
MAX_MODULE_LINES = 400
MAX_CLASS_LINES = 300


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            parts = path.relative_to(REPO_ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(tree: ast.Module, known: dict[str, Path]) -> set[str]:
    """The project modules ``tree`` imports at module level."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in known:
            for a in node.names:
                out.add(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module)
    return out


def test_no_module_over_400_lines_and_no_class_over_300() -> None:
    too_long = []
    for name, path in modules().items():
        source = path.read_text()
        if (lines := source.count("\n")) > MAX_MODULE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.ClassDef):
                continue
            if (span := node.end_lineno - node.lineno + 1) > MAX_CLASS_LINES:
                too_long.append(f"{name}.{node.name}: {span} lines")
    assert not too_long, f"over {MAX_MODULE_LINES} lines a module or {MAX_CLASS_LINES} a class: {too_long}"


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    state: dict[str, str] = {}
    circles: list[list[str]] = []

    def visit(name: str, trail: list[str]) -> None:
        state[name] = "open"
        trail.append(name)
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                circles.append(trail[trail.index(target) :] + [target])
            elif target not in state:
                visit(target, trail)
        trail.pop()
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    return circles


def test_no_import_circle() -> None:
    known = modules()
    graph = {name: imports(ast.parse(path.read_text()), known) - {name} for name, path in known.items()}
    assert not find_circles(graph), f"import circles: {find_circles(graph)}"


def test_the_checks_find_what_they_look_for() -> None:
    known = {"a": Path("a.py"), "a.b": Path("a/b.py"), "a.c": Path("a/c.py")}
    assert imports(ast.parse("from a import b\nimport a.c\nfrom a.b import thing\n"), known) == {"a.b", "a.c"}
    assert imports(ast.parse("from a import thing\n"), known) == {"a"}
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_circles({"a": {"b"}, "b": set(), "c": {"a", "b"}}) == []


PUBLIC_TOP_LEVEL = {
    "replicaft": {"__init__", "manager", "errors"},
    "lighthouse": {"__init__", "__main__", "errors"},
}
"""The modules at the top of each package: its surface (``__init__``), the object a script holds
(``Manager``), the errors a caller catches, and the lighthouse's command line. Everything else
belongs to the subpackage of its concept (issue 38)."""


def test_only_the_public_surface_sits_at_the_top_of_each_package() -> None:
    stray = {package: sorted(p.stem for p in (REPO_ROOT / package).glob("*.py")) for package in PACKAGES}
    extra = {package: sorted(set(names) - PUBLIC_TOP_LEVEL[package]) for package, names in stray.items()}
    assert not any(extra.values()), f"modules outside a subpackage of their concept: {extra}"
