"""Every document the repository cites exists in it: a ``*.md`` named in source, tests,
configs, the Makefile or the docs (a path, a bare name, a relative markdown link) resolves
to a file, so no comment or guide sends a reader to a document they cannot open."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from astrai_core.testing import REPO_ROOT

SCANNED_TREES = ("astrai_core", "plugins", "contrib", "tests", "docs", "examples", "bench")
SCANNED_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".toml", ".yaml", ".yml"}
SKIPPED_DIRS = {"__pycache__", "build", "dist", ".venv"}
# A reference: optional ../ or ./ steps, then a name ending in .md. The look-behind keeps
# templates and globs out ("<name>.md", "{name}.md", "docs/*.md" are no file names).
REFERENCE = re.compile(r"(?<![\w./<>{}*$%-])((?:\.\.?/)*[\w-][\w./-]*\.md)\b")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")


def _scanned_files() -> list[Path]:
    files = [REPO_ROOT / name for name in SCANNED_FILES]
    for tree in SCANNED_TREES:
        files += [path for path in (REPO_ROOT / tree).rglob("*")
                  if path.is_file() and (path.suffix in SUFFIXES or path.name == "Makefile")
                  and not SKIPPED_DIRS & set(path.parts)
                  and not any(part.endswith(".egg-info") for part in path.parts)]
    return sorted(files)


def references(text: str) -> list[tuple[int, str]]:
    """(line, cited path) of every ``*.md`` reference in ``text``, URLs left out."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [(number, match) for match in REFERENCE.findall(URL.sub("", line))]
    return found


def resolves(citing: Path, reference: str) -> bool:
    """Relative to the citing file, the repository root, or docs/ (code names a guide by its
    bare name when it builds the path, ``ROOT / "docs" / "plugins.md"``)."""
    bases = (citing.parent, REPO_ROOT, REPO_ROOT / "docs")
    return any((base / reference).is_file() for base in bases)


def test_every_cited_document_exists():
    # This file is left out: its examples cite documents that do not exist, on purpose.
    files = [path for path in _scanned_files() if path != Path(__file__).resolve()]
    assert len(files) > 300
    cited = [(path, line, reference) for path in files
             for line, reference in references(path.read_text(errors="replace"))]
    assert len(cited) > 100
    missing = [f"{path.relative_to(REPO_ROOT)}:{line}: {reference}"
               for path, line, reference in cited if not resolves(path, reference)]
    assert not missing, "documents cited but not in the repository:\n" + "\n".join(missing)


@pytest.mark.parametrize("text, expected", [
    ('"""The shape of a run config (ROADMAP.md, "Run configuration")."""', ["ROADMAP.md"]),
    ("see [the guide](../../docs/user-guide.md#tools) and docs/plugins.md.",
     ["../../docs/user-guide.md", "docs/plugins.md"]),
    ("https://github.com/org/repo/blob/main/NOTES.md and <name>.md, {kind}.md, docs/*.md", []),
])
def test_references_are_found_and_urls_and_templates_are_not(text, expected):
    assert [reference for _, reference in references(text)] == expected


def test_a_missing_document_does_not_resolve(tmp_path):
    assert not resolves(REPO_ROOT / "astrai_core" / "config" / "schema.py", "ROADMAP.md")
    assert resolves(REPO_ROOT / "plugins" / "astrai-plugin-grpo" / "README.md",
                    "../../docs/user-guide.md")
