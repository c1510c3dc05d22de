"""The layering rules of docs/design/architecture.md, checked on the source: the batch engine imports
nothing from the command line, no module-level import cycle, only ``protgpu/_cuda`` talks to
cuda.core, and no Python file is a junk drawer (over 800 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "protgpu"
MAX_LINES = 800


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, top_level_only: bool) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    if top_level_only:  # what runs at import: module-level statements, try blocks included,
        # functions, classes and `if TYPE_CHECKING:` blocks not
        def runs(stmt):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                return False
            return not (isinstance(stmt, ast.If) and "TYPE_CHECKING" in ast.unparse(stmt.test))

        nodes = [n for stmt in tree.body if runs(stmt) for n in ast.walk(stmt)]
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            found.add(mod)
            for a in node.names:  # `from . import x` may import the submodule x
                found.add(f"{mod}.{a.name}")
    return found


FILES = sorted(PACKAGE.rglob("*.py"))
MODULES = {_module_name(p) for p in FILES}


def test_the_engine_imports_nothing_from_the_command_line():
    for path in PACKAGE.joinpath("batch").rglob("*.py"):
        bad = {m for m in _imports(path, top_level_only=False)
               if m.startswith(("protgpu.commands", "protgpu.cli"))}
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)}"


def test_no_module_level_import_cycle():
    graph = {_module_name(p): {m for m in _imports(p, top_level_only=True) if m in MODULES} for p in FILES}
    for mod in graph:  # a package's __init__ runs before its submodules: that edge is no cycle
        graph[mod] = {m for m in graph[mod] if m != mod and not mod.startswith(m + ".")}
    state: dict[str, int] = {}

    def visit(mod, path):
        state[mod] = 1
        for nxt in sorted(graph[mod]):
            if state.get(nxt) == 1:
                cycle = path[path.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[mod] = 2

    for mod in sorted(graph):
        if mod not in state:
            visit(mod, [mod])


def test_only_the_kernel_layer_talks_to_cuda_core():
    for path in FILES:
        if "_cuda" in path.relative_to(PACKAGE).parts:
            continue
        bad = {m for m in _imports(path, top_level_only=False) if m.startswith(("cuda.core", "cuda.bindings"))}
        assert not bad, f"{path.relative_to(PACKAGE.parent)} imports {sorted(bad)} (only protgpu/_cuda may)"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_no_python_file_over_800_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES
