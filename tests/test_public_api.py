"""Every name of the plugin API earns its place: a plugin of this repository imports it,
the test kit does, or the documentation names it for plugin authors. A name none of them
needs is the core's business and leaves the API (and its promise of stability)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import astrai_core.api as api
from astrai_core.testing import REPO_ROOT

API = "astrai_core.api"


def _api_names_used(path: Path) -> set[str]:
    """The API names a module takes: ``from astrai_core.api import X`` and ``<alias>.X``
    where the module was bound by ``import astrai_core.api as alias`` or
    ``from astrai_core import api``."""
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    aliases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == API:
                names |= {alias.name for alias in node.names}
            elif node.module == "astrai_core":
                aliases |= {alias.asname or alias.name for alias in node.names if alias.name == "api"}
        elif isinstance(node, ast.Import):
            aliases |= {alias.asname for alias in node.names if alias.name == API and alias.asname}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            names.add(node.attr)
    return names


def _code_users() -> set[str]:
    files = [*REPO_ROOT.glob("plugins/*/astrai_plugin_*/**/*.py"),
             *REPO_ROOT.glob("contrib/*/astrai_contrib_*/**/*.py"),
             *(REPO_ROOT / "astrai_core" / "testing").rglob("*.py")]
    assert len(files) > 20
    return set().union(*(_api_names_used(path) for path in files))


def _documented_code() -> str:
    """The code in README.md and docs/*.md: fenced blocks and inline spans (a name in plain
    prose, like "rename", is no documentation of the function)."""
    code = []
    for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        code += re.findall(r"^```.*?^```", text, flags=re.M | re.S)
        text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
        code += re.findall(r"`[^`\n]+`", text)
    return "\n".join(code)


def test_every_api_name_is_used_by_a_plugin_the_test_kit_or_the_docs():
    used = _code_users()
    documented = _documented_code()
    unused = [name for name in api.__all__ if name not in used
              and not re.search(rf"\b{re.escape(name)}\b", documented)]
    assert not unused, ("names in astrai_core.api that no plugin or test kit module imports and "
                        "no doc names (drop them, or document them in docs/plugins.md): "
                        + ", ".join(unused))


def test_the_scan_sees_imports_and_attribute_uses(tmp_path):
    """The scan itself: a from-import and an attribute through an alias both count."""
    module = tmp_path / "target.py"
    module.write_text("from astrai_core.api import Strategy\n"
                      "import astrai_core.api as core_api\n"
                      "def f():\n    from astrai_core import api\n"
                      "    return core_api.pad_rows, api.get_logger, other.kl_estimate\n")
    assert _api_names_used(module) == {"Strategy", "pad_rows", "get_logger"}


def test_the_docs_name_only_api_names_that_exist():
    """``astrai_core.api.X`` and ``from astrai_core.api import X`` in the README, the guides and
    the plugins' READMEs: a dropped or renamed name must not stay in the documentation."""
    pages = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")),
             *sorted(REPO_ROOT.glob("plugins/*/README.md")), *sorted(REPO_ROOT.glob("contrib/*/README.md"))]
    cited = []
    for page in pages:
        for match in re.finditer(r"astrai_core\.api\.(\w+)|from astrai_core\.api import ([\w, ]+)",
                                 page.read_text()):
            names = [match[1]] if match[1] else [name.strip() for name in match[2].split(",")]
            cited += [(page.relative_to(REPO_ROOT), name) for name in names if name]
    assert len(cited) > 5
    stale = [f"{page}: {name}" for page, name in cited if name not in api.__all__]
    assert not stale, "documented as astrai_core.api names but not in it:\n" + "\n".join(stale)
