"""The layers, enforced: every import of ours points inward, and no two modules import each other.

Read from the source (``ast``), imports inside functions included: a lazy
import still makes the importing module depend on the imported one. Only
``if TYPE_CHECKING:`` blocks are left out (annotations, not dependencies).
docs/architecture.md draws the same layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "otel_training"

#: Innermost first. A module may import its own layer and those before it, never one after.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("_text", "_files", "_contain", "_fork", "_ids", "_pids", "_stacks", "_version", "_native", "_native_loader", "_ring", "semconv")),
    ("analysis", ("analysis",)),
    ("processors and exporters", ("_sdk_compat", "exporters", "processors", "hardware")),
    ("config", ("config",)),
    ("pipeline", ("pipeline", "lifecycle", "watchdog")),
    ("assembly", ("assembly",)),  # configure(), the plugins, the drain's start: puts the layers inside together
    ("API", ("events",)),
    ("integrations", ("integrations", "compat")),
    ("report", ("report",)),
    ("package", ("",)),  # otel_training/__init__.py: the public names, loaded lazily
    ("cli", ("cli",)),
]
LAYER_OF = {top: index for index, (_, tops) in enumerate(LAYERS) for top in tops}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()
#: Modules of ours that are not Python files: the C extension built from native/ (it imports nothing of ours).
EXTENSIONS = {"otel_training._native"}


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(inner) for inner in ast.walk(node))
    return skipped


def _known(name: str) -> str | None:
    while name and name not in MODULES and name not in EXTENSIONS:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> Iterator[tuple[str, int]]:
    """(module of ours it imports, line) for every import in ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
            targets = submodules + ([base] if len(submodules) < len(node.names) else [])
        else:
            continue
        for target in targets:
            known = _known(target) if target.startswith("otel_training") else None
            if known is not None and known != module:
                yield known, node.lineno


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYER_OF[parts[1] if len(parts) > 1 else ""]


def _graph() -> dict[str, set[str]]:
    graph = {module: {target for target, _ in imports_of(module)} for module in MODULES}
    return graph | {extension: set() for extension in EXTENSIONS}


def test_every_module_is_in_a_layer():
    assert [module for module in MODULES if (module.split(".") + [""])[1] not in LAYER_OF] == []


def test_imports_point_inward():
    outward = []
    for module in sorted(MODULES):
        for target, line in imports_of(module):
            if _layer(target) > _layer(module):
                outward.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line}: {module} "
                               f"({LAYERS[_layer(module)][0]}) imports {target} ({LAYERS[_layer(target)][0]})")
    assert outward == [], "\n".join(outward)


def test_no_import_cycles():
    """Tarjan's strongly connected components over the import graph.

    A package's ``__init__`` naming its own submodules is left out: importing a
    submodule runs its package first in any case, so that edge orders nothing.
    """
    graph = {module: {target for target in targets if not target.startswith(module + ".")}
             for module, targets in _graph().items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # the graph is a few hundred modules deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    assert cycles == []


def _folder(module: str) -> str:
    """A module's folder (``otel_training.pipeline.drain`` -> ``pipeline``); a top-level module is its own."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_folder_imports_back_up_even_within_a_layer():
    """Folders import one way: two folders of one layer (pipeline/ and watchdog/, integrations/ and compat/)
    never import each other, whichever modules do it, so the layer diagram can draw every folder in one order."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module in sorted(MODULES):
        for target, line in imports_of(module):
            pair = (_folder(module), _folder(target))
            if pair[0] != pair[1]:
                edges.setdefault(pair, []).append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} -> {target}")
    both_ways = [f"{a}/ <-> {b}/: {edges[(a, b)][0]} and {edges[(b, a)][0]}"
                 for (a, b) in sorted(edges) if a < b and (b, a) in edges]
    assert both_ways == [], "\n".join(both_ways)
    # and no longer loop through three or more folders: an order exists (Kahn's algorithm over the folders)
    folders = {folder for pair in edges for folder in pair}
    incoming = {folder: {a for (a, b) in edges if b == folder} for folder in folders}
    ordered: list[str] = []
    ready = sorted(folder for folder in folders if not incoming[folder])
    while ready:
        folder = ready.pop()
        ordered.append(folder)
        for other in folders:
            if folder in incoming[other]:
                incoming[other].discard(folder)
                if not incoming[other] and other not in ordered and other not in ready:
                    ready.append(other)
    assert sorted(ordered) == sorted(folders), sorted(folders - set(ordered))


def test_the_check_sees_lazy_and_relative_imports(tmp_path: Path):
    """The checker itself: an import inside a function counts; one under TYPE_CHECKING does not."""
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from otel_training.cli import main\n"
              "def f():\n    from otel_training.report import job\n")
    tree = ast.parse(source)
    skipped = _type_checking_nodes(tree)
    lazy = [node for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and id(node) not in skipped]
    assert [node.module for node in lazy] == ["typing", "otel_training.report"]
    assert ("otel_training.pipeline.telemetry" in {t for t, _ in imports_of("otel_training.events.runtime")})


def test_the_architecture_doc_names_every_layer_member():
    doc = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    missing = [top for top in LAYER_OF if top and f"{top}/" not in doc and f"{top}.py" not in doc and top not in doc]
    assert missing == []
    tops = {path.name.removesuffix(".py") for path in PACKAGE.iterdir()
            if (path.is_dir() and (path / "__init__.py").exists()) or path.suffix == ".py"} - {"__init__"}
    assert tops <= set(LAYER_OF), tops - set(LAYER_OF)
