"""The plugin guide documents every hook and every spec field of hookspecs.py."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from astrai_core import hookspecs
from astrai_core.plugins.specs import SPEC_CLASSES, Spec

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "plugins.md"


def _hook_sections() -> dict[str, str]:
    text = GUIDE.read_text()
    reference = text.split("## Hook reference", 1)[1]
    parts = re.split(r"^### `(\w+)\(\)`\s*$", reference, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_hook_is_documented_with_its_record_and_fields():
    sections = _hook_sections()
    declared = {name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction)
                if name.startswith("astrai_")}
    assert declared == set(hookspecs.HOOK_FOR_KIND.values())
    assert set(sections) == declared, "docs/plugins.md must have one section per hook"
    for kind, hook_name in hookspecs.HOOK_FOR_KIND.items():
        section = sections[hook_name]
        spec_class = SPEC_CLASSES[kind]
        assert f"`{spec_class.__name__}`" in section
        assert f"kind `{kind}`" in section
        for field in set(spec_class.model_fields) - set(Spec.model_fields):
            assert f"`{field}`" in section, f"{spec_class.__name__}.{field} is undocumented"


def test_common_fields_are_documented():
    reference = GUIDE.read_text().split("## Hook reference", 1)[1]
    for field in Spec.model_fields:
        assert f"| `{field}` |" in reference
