"""Architecture rules that hold by test: plugins import only the public API, the core never
imports a plugin, components never rediscover plugins, and training/ has no import circle."""

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
    allowed = {"astrai_core/plugins.py"}
    assert set(callers) <= allowed, sorted(set(callers) - allowed)


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_training_has_no_import_circle():
    package = CORE / "training"
    modules = {_module_name(path): path for path in package.glob("*.py")}
    graph = {name: {module for _, module in _imports(path) if module in modules and module != name}
             for name, path in modules.items()}
    seen: dict[str, str] = {}  # name -> "active" | "done"

    def visit(name: str, trail: list[str]) -> None:
        seen[name] = "active"
        for target in sorted(graph[name]):
            if seen.get(target) == "active":
                cycle = trail[trail.index(target):] + [target] if target in trail \
                    else [name, target]
                raise AssertionError("import circle: " + " -> ".join(cycle))
            if target not in seen:
                visit(target, trail + [target])
        seen[name] = "done"

    for name in sorted(graph):
        if name not in seen:
            visit(name, [name])
