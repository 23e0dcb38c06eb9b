"""The package's shape, read from its source with ast (nothing is imported): no function over 60 lines
(from `def` to its last line), and imports that form no cycle and run only down the layers.

The layers, bottom first (LAYERS), each of units, a unit a package or a module directly in uph/:
  support  every module no layer names: uph.errors, io, config, device, records, artifacts, splits, ...
  studies  uph.lm.data, uph.attention, uph.feedback: each study's data, models and training
  engine   uph.lm.engine: fitting theta on a frozen LM's tokens
  jobs     uph.lm.jobs: the LM stages' jobs, engine runs over users and their tables
  seeded   uph.seeded_comparison: whether two sets of seeded runs agree as samples
  report   uph.report: the study read back (answers, summary, figures)
  compare  uph.compare: one study's results against a reference
A module imports its own unit or a lower layer's units: never a higher layer's (upward), nor another
unit of its own layer (sideways: each study stands alone); the support modules import one another freely.
Imports count wherever they stand: at the top, in a function, under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "uph"
MAX_FUNCTION_LINES = 60

# the layers above the support unit, bottom first (the module docstring)
LAYERS = [
    ["uph.lm.data", "uph.attention", "uph.feedback"],
    ["uph.lm.engine"],
    ["uph.lm.jobs"],
    ["uph.seeded_comparison"],
    ["uph.report"],
    ["uph.compare"],
]
SUPPORT = "support"  # the unit of every module no layer names


def modules() -> dict[str, Path]:
    """Dotted module name -> its file, for every module of the package (a package by its __init__.py)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(name: str, path: Path, known) -> dict[str, int]:
    """The package's modules that module `name` imports anywhere in its file (at the top, in a function,
    under TYPE_CHECKING) -> the line of the first such import. `from a.b import c` counts a.b.c where
    that is a module, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's package, up level - 1
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import uph.a.b` of a module; a name's module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.setdefault(target, node.lineno)
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}, within the package."""
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def unit(module: str) -> tuple[int, str]:
    """(layer, unit) of a module: the LAYERS entry it is or lies in, else the support unit (layer -1)."""
    for layer, units in enumerate(LAYERS):
        for name in units:
            if module == name or module.startswith(name + "."):
                return layer, name
    return -1, SUPPORT


def reachable(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    """Every module that `start` imports, directly or through others."""
    seen, todo = set(), list(graph[start])
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph[module])
    return seen


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The import cycles: each group of modules that reach one another (a module that imports itself, alone),
    sorted."""
    reach = {module: reachable(graph, module) for module in graph}
    groups = {tuple(sorted(other for other in reach[module] if module in reach[other])) for module in reach}
    return sorted(list(group) for group in groups if group)


def against_layers(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of `graph` that runs up the layers or sideways between units of one layer (LAYERS)."""
    offending = []
    for module, targets in sorted(graph.items()):
        layer, own = unit(module)
        for target, line in sorted(targets.items()):
            target_layer, target_unit = unit(target)
            if target_layer > layer:
                offending.append(f"{module} (line {line}) imports {target}, a higher layer (upward)")
            elif target_layer == layer and target_unit != own:
                offending.append(f"{module} (line {line}) imports {target}, another unit of its layer (sideways)")
    return offending


def test_no_function_is_longer_than_60_lines():
    """From `def` to its last line, docstring included: every function and method, nested ones too."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}: {length} lines")
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)


def test_the_package_imports_form_no_cycle():
    graph = import_graph()
    found = cycles(graph)
    described = [
        "; ".join(
            f"{module} imports {target} (line {line})"
            for module in cycle
            for target, line in sorted(graph[module].items())
            if target in cycle
        )
        for cycle in found
    ]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_imports_run_down_the_layers_only():
    """LAYERS: a module imports its own unit or a lower layer's units, never a higher layer's or another
    unit of its own layer."""
    offending = against_layers(import_graph())
    assert not offending, "imports against the layers (LAYERS):\n" + "\n".join(offending)


def private_imports() -> list[str]:
    """Each `from uph.x import _name` in a module other than uph.x: a private helper used outside its module."""
    found = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "uph" and node.module != name:
                found += [
                    f"{name} (line {node.lineno}) imports {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
    return found


def test_no_module_imports_another_modules_private_name():
    """A name used outside its module is part of that module's interface: it is named without a leading _."""
    found = private_imports()
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_the_checks_see_a_cycle_and_imports_against_the_layers():
    """The checks on graphs made to fail: a cycle and a self-import found; the engine importing the jobs
    (upward), one study another's (sideways), while the jobs may import the engine and any module the
    support unit."""
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {"e": 1}}
    assert cycles(graph) == [["a", "b", "c"], ["e"]]
    graph = {
        "uph.lm.engine.fit": {"uph.lm.jobs.refit": 3, "uph.errors": 4},
        "uph.attention.tasks": {"uph.feedback.training": 5},
        "uph.lm.jobs.refit": {"uph.lm.engine.fit": 6, "uph.lm.jobs.choices": 7, "uph.config": 8},
        "uph.errors": {},
    }
    assert against_layers(graph) == [
        "uph.attention.tasks (line 5) imports uph.feedback.training, another unit of its layer (sideways)",
        "uph.lm.engine.fit (line 3) imports uph.lm.jobs.refit, a higher layer (upward)",
    ]
