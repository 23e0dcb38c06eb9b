"""uph's modules import one another without a circle, uph/lm/'s rooms import only downwards
(jobs -> engine -> data), and no module imports another's private helper."""

import ast

from conftest import REPO

ROOMS = ["uph.lm.data", "uph.lm.engine", "uph.lm.jobs"]  # each may import only those before it


def imports() -> dict[str, dict[str, set[str]]]:
    """module -> {imported uph module -> the names imported from it (empty for `import module`)}."""
    found = {}
    for path in sorted((REPO / "uph").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        found[module] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "uph":
                found[module].setdefault(node.module, set()).update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "uph":
                        found[module].setdefault(alias.name, set())
    return found


def room(module: str) -> int | None:
    return next((i for i, prefix in enumerate(ROOMS) if module.startswith(prefix + ".")), None)


def test_the_lm_rooms_import_only_downwards():
    found = imports()
    upward = [
        (module, imported)
        for module, deps in found.items()
        for imported in deps
        if room(module) is not None and room(imported) is not None and room(imported) > room(module)
    ]
    assert upward == []
    assert {room(module) for module in found} >= {0, 1, 2}


def test_no_module_imports_itself_back_or_another_modules_private_name():
    found = imports()
    graph = {module: set(deps) for module, deps in found.items()}
    state, circles = {}, []

    def visit(module, path):
        if state.get(module) == "open":
            circles.append(path[path.index(module) :] + [module])
        elif module in graph and module not in state:
            state[module] = "open"
            for imported in sorted(graph[module]):
                visit(imported, [*path, module])
            state[module] = "done"

    for module in sorted(graph):
        visit(module, [])
    assert circles == []
    private = [
        (module, imported, name)
        for module, deps in found.items()
        for imported, names in deps.items()
        for name in names
        if name.startswith("_") and imported != module
    ]
    assert private == []
