"""docs/design/architecture.md's table "Who may import whom", checked against the code.

The table's rows are layers, in order: a module may import its own layer and the layers above
it, never one below. The checks read the source with `ast` (no imports, no subprocesses):

* every module under src/uma sits in exactly one layer, and every name in the table is a module;
* every import of a uma module, at module level or inside a function, goes to the importer's
  layer or one above it;
* the imports made at module level form no circle. An import inside a function runs when the
  function is called, after every module has loaded, so it may close a circle (the layer rule
  still holds it).

Imports under `if TYPE_CHECKING:` never run; they name types for mypy (uma.embeddings names
the core's Embedder it is handed), so neither rule counts them.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
PACKAGE = SRC / "uma"
DOC = ROOT / "docs" / "design" / "architecture.md"
TABLE_HEADING = "## Who may import whom"
COMPILED = {"uma._core": PACKAGE / "_core.pyx"}  # no Python source to read imports from


@dataclass(frozen=True)
class Import:
    importer: str  # 'uma.config'
    target: str  # the uma module it imports: 'uma.knobs'
    line: int
    lazy: bool  # inside a function: runs when called, not when the importer loads

    def __str__(self) -> str:
        where = "in a function" if self.lazy else "at module level"
        return f"{self.importer} imports {self.target} {where} (line {self.line})"


@functools.cache
def modules() -> dict[str, Path]:
    """Every module of the package, by name: 'uma' for uma/__init__.py, 'uma.sched.bound'."""
    found = dict(COMPILED)
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


@functools.cache
def layers() -> tuple[tuple[str, frozenset[str]], ...]:
    """The table's rows in order: (layer, the modules it names), each name as written there:
    `config` is uma.config, `sched/*` every module of uma.sched, `__init__` the package."""
    text = DOC.read_text(encoding="utf-8")
    assert TABLE_HEADING in text, f"{DOC} has no section {TABLE_HEADING!r}"
    rows = []
    for line in text.split(TABLE_HEADING, 1)[1].strip().splitlines():
        if not line.startswith("|"):
            break  # the table ends at its first line that is not a row
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if cells[0] in ("layer", "---"):
            continue  # the header and the line under it
        rows.append((cells[0], frozenset(re.findall(r"`([^`]+)`", cells[1]))))
    assert rows, f"the table under {TABLE_HEADING!r} in {DOC} has no rows"
    return tuple(rows)


def named(name: str) -> set[str]:
    """The modules a name in the table stands for."""
    if name == "__init__":
        return {"uma"}
    if name.endswith("/*"):
        package = "uma." + name[:-2].replace("/", ".")
        return {m for m in modules() if m == package or m.startswith(package + ".")}
    module = "uma." + name.replace("/", ".")
    return {module} if module in modules() else set()


@functools.cache
def layer_of() -> dict[str, list[int]]:
    """Each module's rows in the table (one, if the table is right), by index."""
    rows: dict[str, list[int]] = {m: [] for m in modules()}
    for index, (_, names) in enumerate(layers()):
        for name in names:
            for module in named(name):
                rows[module].append(index)
    return rows


@functools.cache
def imports_of(module: str) -> tuple[Import, ...]:
    """The uma modules `module` imports where the import can run (not under TYPE_CHECKING)."""
    path = modules()[module]
    if module in COMPILED:
        return ()
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, lazy: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for branch in child.orelse:  # the else branch runs
                    visit_one(branch, lazy)
                continue
            visit_one(child, lazy)

    def visit_one(node: ast.AST, lazy: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(Import(module, target, node.lineno, lazy)
                         for target in _targets(node, package))
            return
        visit(node, lazy or isinstance(
            node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, lazy=False)
    return tuple(found)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, package: str) -> list[str]:
    """The uma modules one import statement loads: `import uma.x` loads uma.x, `from uma
    import x` uma.x where x is a module (else uma itself), `from . import x` the same,
    relative to the importer's package."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == "uma" or a.name.startswith("uma.")]
    if node.level:
        base_parts = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(base_parts + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base != "uma" and not base.startswith("uma."):
        return []
    return list(dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base
                              for a in node.names))


# --- the checks ------------------------------------------------------------------------------


def test_every_name_in_the_table_is_a_module():
    stale = [f"{layer}: `{name}`" for layer, names in layers() for name in sorted(names)
             if not named(name)]
    assert not stale, (f"{DOC.name}'s table names modules that do not exist under src/uma "
                       f"(moved or removed? fix the table): {', '.join(stale)}")


@pytest.mark.parametrize("module", sorted(modules()))
def test_every_module_is_in_exactly_one_layer(module):
    rows = [layers()[i][0] for i in layer_of()[module]]
    assert rows, (f"{module} is in no layer of {DOC.name}'s table {TABLE_HEADING!r}: every "
                  f"module must be in exactly one; add it to the row of what it imports")
    assert len(rows) == 1, (f"{module} is in {len(rows)} layers of {DOC.name}'s table "
                            f"({', '.join(rows)}): every module must be in exactly one")


@pytest.mark.parametrize("module", sorted(modules()))
def test_imports_go_to_the_same_layer_or_one_above(module):
    own = layer_of()[module]
    assert len(own) == 1, (f"{module} must be in exactly one layer of {DOC.name}'s table to "
                           f"check its imports (test_every_module_is_in_exactly_one_layer)")
    broken = []
    for imp in imports_of(module):
        theirs = layer_of().get(imp.target)
        if not theirs:
            broken.append(f"{imp}, which the table places in no layer")
        elif min(theirs) > own[0]:
            broken.append(f"{imp}: {module} is in layer {layers()[own[0]][0]!r}, "
                          f"{imp.target} in {layers()[min(theirs)][0]!r}, a layer below it")
    assert not broken, ("a module may import only its own layer and the layers above it in "
                        f"{DOC.name}'s table:\n  " + "\n  ".join(broken))


def test_no_import_circle_at_module_level():
    edges: dict[str, dict[str, Import]] = {m: {} for m in modules()}
    for module in modules():
        for imp in imports_of(module):
            if not imp.lazy and imp.target in edges and imp.target != module:
                edges[module].setdefault(imp.target, imp)
    circles = [" -> ".join(str(edges[a][b]) for a, b in zip(c, c[1:] + c[:1], strict=True))
               for c in _circles(edges)]
    assert not circles, ("imports made at module level must form no circle (import one of "
                         "them inside the function that needs it, or move what both need to "
                         "a module above them):\n  " + "\n  ".join(circles))


def _circles(edges: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One shortest circle through each group of modules that import each other (Tarjan's
    strongly connected components, then a breadth-first search inside each)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return [_shortest_circle(min(group), group, edges) for group in groups]


def _shortest_circle(start: str, group: set[str], edges: dict[str, dict[str, Import]]
                     ) -> list[str]:
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(edges[node]):
                if nxt == start:
                    return paths[node]
                if nxt in group and nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start} in its own component")  # never: SCC
