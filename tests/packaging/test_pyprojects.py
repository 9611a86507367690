"""Every distribution's pyproject: its entry point, a ranged astrai-core dependency, and
its dependencies on other plugins (ppo depends on gae: its default advantage estimator,
reached through the registry by name, never by import)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")

REPO = Path(__file__).resolve().parents[2]


def _build_dists():
    spec = importlib.util.spec_from_file_location("build_dists", REPO / "tools" / "build_dists.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _project(directory: Path) -> dict:
    return tomllib.loads((directory / "pyproject.toml").read_text())["project"]


def _plugin_dirs() -> list[Path]:
    return _build_dists().distribution_dirs(REPO)[1:]


def test_make_dist_covers_every_distribution():
    dirs = _build_dists().distribution_dirs(REPO)
    assert dirs[0] == REPO
    assert set(dirs[1:]) == {p.parent for p in REPO.glob("plugins/*/pyproject.toml")} | {
        p.parent for p in REPO.glob("contrib/*/pyproject.toml")}
    names = [_project(d)["name"] for d in dirs]
    assert len(set(names)) == len(names)
    assert {f"astrai-plugin-{p}" for p in ("grpo", "ppo", "dpo", "distill", "gae", "vllm", "qwen3", "npu",
                                                   "ray")} <= set(names)


@pytest.mark.parametrize("directory", _plugin_dirs(), ids=lambda d: d.name)
def test_plugin_declares_its_entry_point_and_a_ranged_core_dependency(directory):
    project = _project(directory)
    core_version = Version(_project(REPO)["version"])
    requirements = {Requirement(r).name: Requirement(r) for r in project["dependencies"]}
    core = requirements["astrai-core"]
    operators = {spec.operator for spec in core.specifier}
    assert operators & {">=", ">", "~="} and (operators & {"<", "<=", "~="}), (
        f"{project['name']}: astrai-core needs a version range, got {core.specifier}")
    assert core.specifier.contains(core_version)
    entry_points = project["entry-points"]["astrai"]
    assert len(entry_points) == 1
    (name, module), = entry_points.items()
    assert (directory / module).is_dir(), f"{module} is not a package of {directory.name}"
    if directory.parent.name == "plugins":
        assert directory.name == f"astrai-plugin-{name}" and module == f"astrai_plugin_{name}"


def test_ppo_depends_on_gae_with_a_range():
    project = _project(REPO / "plugins" / "astrai-plugin-ppo")
    gae = next(Requirement(r) for r in project["dependencies"]
               if Requirement(r).name == "astrai-plugin-gae")
    gae_version = Version(_project(REPO / "plugins" / "astrai-plugin-gae")["version"])
    assert gae.specifier.contains(gae_version) and len(gae.specifier) == 2


def test_built_file_names_give_versions_and_old_sdist_names_are_refused():
    tools = _build_dists()
    files = [Path("astrai_core-0.1.0.tar.gz"), Path("astrai_plugin_ppo-0.2.0-py3-none-any.whl")]
    assert tools.versions(files) == {"astrai-core": "0.1.0", "astrai-plugin-ppo": "0.2.0"}
    with pytest.raises(SystemExit, match="not normalized"):
        tools.versions([Path("astrai-core-0.1.0.tar.gz")])
