"""docs/from-trl.md stays true: every astrai key in its tables is a key of the config
reference (the pydantic models and the components' options), every TRL name an option of
the installed TRL config it is listed under."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "from-trl.md"
SPAN = re.compile(r"`([^`]+)`")


def _trl_configs() -> dict[str, set[str]]:
    import trl
    from trl.experimental.gkd import GKDConfig

    classes = {name: getattr(trl, name) for name in
               ("SFTConfig", "GRPOConfig", "DPOConfig", "RewardConfig")}
    classes["GKDConfig"] = GKDConfig
    return {name: {f.name for f in dataclasses.fields(cls)} for name, cls in classes.items()}


def _tables() -> list[tuple[str, str, str]]:
    """(section title, TRL cell, astrai cell) of every table row."""
    rows, section = [], ""
    for line in DOC.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and cells[0] not in ("TRL", "") and not set(cells[0]) <= {"-"}:
            rows.append((section, cells[0], cells[1]))
    return rows


def test_the_doc_has_a_table_per_trl_config():
    sections = {section for section, _, _ in _tables()}
    assert sections == {"Every trainer", *_trl_configs()}
    assert len(_tables()) > 50


def test_every_trl_name_is_an_option_of_its_config():
    configs = _trl_configs()
    for section, trl_cell, _ in _tables():
        names = SPAN.findall(trl_cell)
        assert names, f"{section}: a row without a TRL name: {trl_cell}"
        owners = configs.values() if section == "Every trainer" else [configs[section]]
        for name in names:
            assert all(name in fields for fields in owners), f"{section}: {name} is not a TRL option"


def test_every_astrai_key_is_in_the_config_reference():
    from astrai_core.cli.config_reference import expected_rows

    keys = set(expected_rows())
    for section, _, astrai_cell in _tables():
        spans = SPAN.findall(astrai_cell)
        if astrai_cell.startswith("—"):
            continue
        assert spans, f"{section}: {astrai_cell!r} names no astrai key"
        assert spans[0] in keys, f"{section}: {spans[0]} is not an astrai config key"


@pytest.mark.parametrize("link", ["docs/from-trl.md"])
def test_the_readme_links_the_page(link):
    assert f"({link})" in (DOC.parents[1] / "README.md").read_text()
