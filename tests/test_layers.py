"""The house: every import runs down the layers, and no module imports itself back.

Layers (README, "Layout"): the trace core (`tracekit/core/`) at the bottom, the analyses
(`analyses/`, installed as `tracekit.analyses`) on it, the front (`tracekit/front/`: the command,
tables, export, pictures, serving) on top; the runners (`runners/`, `tracekit.runners`) apart,
using only the core. Imports are read from the source (every `import`, also inside functions),
so a lazy import cannot hide an upward one."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"tracekit": ROOT / "tracekit", "tracekit.analyses": ROOT / "analyses", "tracekit.runners": ROOT / "runners"}
# layer → the layers its modules may import (besides their own)
MAY_IMPORT = {"core": set(), "analyses": {"core"}, "runners": {"core"}, "front": {"core", "analyses", "runners"},
              "package": {"core", "front"}}


def module_files() -> dict[str, Path]:
    """Every module of the installed package: dotted name → file."""
    found = {}
    for package, folder in FOLDERS.items():
        for file in folder.rglob("*.py"):
            parts = list(file.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = file
    return found


MODULES = module_files()


def layer(module: str) -> str:
    for prefix, name in (("tracekit.core", "core"), ("tracekit.front", "front"), ("tracekit.analyses", "analyses"),
                         ("tracekit.runners", "runners")):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "package"  # tracekit/__init__.py, tracekit/__main__.py


def imports(module: str) -> set[str]:
    """The package's own modules that `module` imports, anywhere in its file."""
    file = MODULES[module]
    is_package = file.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            # `from package import module` imports the module; `from module import name` the module
            names = [f"{source}.{a.name}" if f"{source}.{a.name}" in MODULES else source for a in node.names]
        else:
            continue
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


GRAPH = {module: imports(module) for module in MODULES}


def test_the_layers_are_folders():
    assert {layer(m) for m in MODULES} == {"core", "analyses", "runners", "front", "package"}
    assert (ROOT / "tracekit" / "core" / "loading.py").is_file() and (ROOT / "tracekit" / "front" / "cli").is_dir()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_import_runs_down(module):
    allowed = MAY_IMPORT[layer(module)] | {layer(module)}
    upward = sorted(m for m in GRAPH[module] if layer(m) not in allowed)
    assert not upward, f"{module} ({layer(module)}) imports {upward}"


def test_no_module_imports_itself_back():
    """No cycle in the module graph (Tarjan's strongly connected components, none larger
    than one module)."""
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_checker_sees_an_upward_import(tmp_path):
    """The test itself catches what it exists for: an import inside a function, relative or
    absolute, of a higher layer."""
    global MODULES
    saved = dict(MODULES)
    try:
        file = tmp_path / "probe.py"
        file.write_text("def f():\n    from ..front import render\n    import tracekit.analyses.diff\n")
        MODULES["tracekit.core.probe"] = file
        assert imports("tracekit.core.probe") == {"tracekit.front.render", "tracekit.analyses.diff"}
    finally:
        MODULES = saved
