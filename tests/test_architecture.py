"""Architecture rules that hold by test: plugins import only the public API, the core never
imports a plugin, components never rediscover plugins, the core has no import circle, the
model is pure torch, the core's packages import only from the layers below them, no module
imports another's private names, and classes and functions keep the house sizes."""

from __future__ import annotations

import ast
from pathlib import Path

from astrai_core.testing import REPO_ROOT

PUBLIC = {"astrai_core", "astrai_core.api"}
CORE = REPO_ROOT / "astrai_core"


def _package_files(root: Path) -> list[Path]:
    """Every plugin's and contrib's package modules (their tests may use the test kit)."""
    return sorted(path for path in root.glob("*/astrai_*/**/*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in the file, at any depth (lazy imports too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
    return found


def test_plugins_import_only_the_public_api():
    files = _package_files(REPO_ROOT / "plugins") + _package_files(REPO_ROOT / "contrib")
    assert len(files) > 20
    offending = [f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
                 for path in files for line, module in _imports(path)
                 if module.split(".")[0] == "astrai_core" and module not in PUBLIC]
    assert not offending, "plugins must import from astrai_core.api:\n" + "\n".join(offending)


def test_the_public_api_names_exist():
    import astrai_core.api as api

    missing = [name for name in api.__all__ if not hasattr(api, name)]
    assert not missing
    assert len(set(api.__all__)) == len(api.__all__)


def test_the_core_never_imports_a_plugin():
    offending = [f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
                 for path in CORE.rglob("*.py") for line, module in _imports(path)
                 if module.startswith(("astrai_plugin_", "astrai_contrib_"))]
    assert not offending, offending


def test_the_product_never_imports_the_test_kit():
    """astrai_core.testing is for tests; the rest of the core runs without it."""
    kit = CORE / "testing"
    offending = [f"{path.relative_to(REPO_ROOT)}:{line}: {module}"
                 for path in CORE.rglob("*.py") if not path.is_relative_to(kit)
                 for line, module in _imports(path)
                 if module == "astrai_core.testing" or module.startswith("astrai_core.testing.")]
    assert not offending, offending


def test_only_commands_discover_plugins():
    """Components get the registry passed down (or the process's cached one)."""
    callers = []
    for path in [*CORE.rglob("*.py"), *(REPO_ROOT / "plugins").rglob("astrai_plugin_*/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "load_plugins"):
                callers.append(str(path.relative_to(REPO_ROOT)))
    allowed = {"astrai_core/plugins/discovery.py"}
    assert set(callers) <= allowed, sorted(set(callers) - allowed)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _core_import_graph() -> dict[str, set[str]]:
    """module -> the core modules it imports, at any depth: module level, in functions and
    under TYPE_CHECKING; relative imports resolved; ``from package import name`` is the
    submodule when there is one, else the package."""
    paths = {_module_name(path): path for path in CORE.rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                if base.split(".")[0] == "astrai_core":
                    targets |= {known(f"{base}.{alias.name}") for alias in node.names}
            elif isinstance(node, ast.Import):
                targets |= {known(alias.name) for alias in node.names
                            if alias.name.split(".")[0] == "astrai_core"}
        graph[name] = {target for target in targets if target and target != name}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(graph.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == name:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


def test_the_core_has_no_import_circle():
    graph = _core_import_graph()
    assert len(graph) > 100
    circles = _circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_model_is_pure_torch():
    """model/ is the network only: reading/writing it (checkpoints), configs, plugins and RL
    math sit above it, so it imports no other core module (errors at most)."""
    graph = _core_import_graph()
    offending = sorted(f"{name} -> {target}" for name, targets in graph.items()
                       if name.startswith("astrai_core.model")
                       for target in targets
                       if not target.startswith("astrai_core.model") and target != "astrai_core.errors")
    assert any(name.startswith("astrai_core.model.") for name in graph)
    assert not offending, "astrai_core/model/ imports:\n" + "\n".join(offending)


# The core's packages (and top-level modules) from the bottom up. A module imports from its
# own unit and from units of LOWER layers only; units of one layer are independent. The
# plugin system (the top-level package's __init__, hook specs, spec records, registry,
# discovery, built-in registrations, protocols: the astrai_core.plugins package, with the
# package's own __init__ and the astrai_core.hookspecs re-export) is one unit.
PLUGIN_SYSTEM = ("", "hookspecs", "plugins")
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "log", "version"),
    ("plugin system",),
    ("model", "data", "devices", "environments"),
    ("model_backends",),  # other models behind the native model's interface
    ("distributed", "rl"),
    ("checkpoints",),
    ("sampling",),
    ("serving", "config"),
    ("rewards", "trackers"),
    ("rollout",),
    ("training",),
    ("online",),  # the online (RL) loop on top of the trainer's pieces
    ("strategies",),
    ("tinker",),  # the Tinker-compatible training service
    ("cli", "api"),
    ("testing",),  # the kit drives whole runs (its fault driver calls the CLI)
)


def _unit(module: str) -> str:
    top = module.split(".")[1] if "." in module else ""
    return "plugin system" if top in PLUGIN_SYSTEM else top


def test_imports_only_go_down_the_layers():
    rank = {unit: level for level, units in enumerate(LAYERS) for unit in units}
    graph = _core_import_graph()
    undeclared = sorted({_unit(name) for name in graph} - rank.keys())
    assert not undeclared, f"declare these core packages in LAYERS: {undeclared}"
    upward = sorted(f"{name} -> {target}" for name, targets in graph.items() for target in targets
                    if _unit(name) != _unit(target) and rank[_unit(target)] >= rank[_unit(name)])
    assert not upward, "imports that do not go down the layers:\n" + "\n".join(upward)


def _house_files() -> list[Path]:
    """The product's code: the core, the plugins' and contrib's packages, the benchmarks."""
    return sorted([*CORE.rglob("*.py"), *_package_files(REPO_ROOT / "plugins"),
                   *_package_files(REPO_ROOT / "contrib"), *(REPO_ROOT / "bench").rglob("*.py")])


def test_no_module_imports_another_modules_private_names():
    """A name shared between modules is public in the module that owns it; ``_name`` means
    "this module's own", so moving or changing it breaks nobody else."""
    offending = []
    for path in _house_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom)
                    and (node.level or (node.module or "").startswith(("astrai_", "bench")))):
                offending += [f"{path.relative_to(REPO_ROOT)}:{node.lineno}: {node.module}.{alias.name}"
                              for alias in node.names
                              if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not offending, "private names imported from another module:\n" + "\n".join(offending)


MAX_CLASS_LINES = 250
MAX_FUNCTION_LINES = 60


def oversized(tree: ast.AST) -> list[tuple[int, str, int]]:
    """(line, name, length) of every class over MAX_CLASS_LINES and function (methods and
    nested ones too) over MAX_FUNCTION_LINES, counted from the def line to its last line."""
    found = []
    for node in ast.walk(tree):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and node.end_lineno - node.lineno + 1 > limit:
            found.append((node.lineno, node.name, node.end_lineno - node.lineno + 1))
    return found


def test_classes_and_functions_keep_the_house_sizes():
    files = _house_files()
    assert len(files) > 200
    offending = [f"{path.relative_to(REPO_ROOT)}:{line}: {name} ({length} lines)"
                 for path in files for line, name, length in oversized(ast.parse(path.read_text()))]
    assert not offending, (f"classes over {MAX_CLASS_LINES} lines or functions over "
                           f"{MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(offending))


def test_the_size_check_counts_from_def_to_last_line():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    fits = f"def fits():\n{body}\n"
    too_long = f"def too_long():\n{body}\n    return x0\n"
    assert oversized(ast.parse(fits)) == []
    assert oversized(ast.parse(too_long)) == [(1, "too_long", MAX_FUNCTION_LINES + 1)]
    methods = "\n".join(f"    def m{i}(self):\n        return {i}\n" for i in range(84))
    assert [name for _, name, _ in oversized(ast.parse(f"class Big:\n{methods}"))] == ["Big"]
