"""`pip install astrai-plugin-ppo` from the built wheels, in a real fresh venv.

Builds every distribution (tools/build_dists.py, what `make dist` runs), creates a venv
without the system's or this venv's packages, installs astrai-plugin-ppo with
``--find-links`` and the CPU torch pin of constraints.txt, and checks that astrai-core and
astrai-plugin-gae arrive as its dependencies, that `astrai list-plugins --json` shows
ppo and gae ok, and that two PPO steps run with the installed test kit (whose tokenizer
is package data). Slow: most of its time is pip unpacking torch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

from .test_pyprojects import REPO, _build_dists

pytestmark = pytest.mark.slow

PPO_RUN = textwrap.dedent("""
    import sys
    from pathlib import Path

    import yaml
    from astrai_core.testing import tiny_run_config, write_arith_prompts

    work = Path(sys.argv[1])
    prompts = write_arith_prompts(work / "prompts.jsonl", count=16)
    strategy = {"name": "ppo", "group_size": 2, "epochs": 1, "mini_batches": 1}
    config = tiny_run_config(work, prompts, strategy, max_steps=2)
    (work / "ppo.yaml").write_text(yaml.safe_dump(config))
""")


def _run(command: list[str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    # No PYTHONPATH: only what the venv installed may be imported (never this checkout).
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, f"{command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def test_ppo_installs_from_wheels_with_its_dependencies_and_trains(tmp_path):
    dist = tmp_path / "dist"
    files = _build_dists().build_all(dist)
    built = {p.name for p in files}
    assert len(_build_dists().versions(files)) == len(_build_dists().distribution_dirs(REPO))
    assert {"astrai_core-0.1.0-py3-none-any.whl", "astrai_core-0.1.0.tar.gz",
            "astrai_plugin_ppo-0.1.0-py3-none-any.whl", "astrai_plugin_gae-0.1.0.tar.gz"} <= built

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(env_dir)
    python = env_dir / "bin" / "python"
    _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q",
          "--find-links", str(dist), "-c", str(REPO / "constraints.txt"), "astrai-plugin-ppo"],
         cwd=tmp_path)

    installed = json.loads(_run([str(python), "-c", (
        "import json, importlib.metadata as m; print(json.dumps({d.metadata['Name']: d.version "
        "for d in m.distributions()}))")], cwd=tmp_path).stdout)
    assert installed["astrai-core"] == "0.1.0" and installed["astrai-plugin-gae"] == "0.1.0"
    assert installed["torch"].startswith("2.13.0")
    assert "astrai-plugin-grpo" not in installed  # only what ppo needs

    plugins = json.loads(_run([str(env_dir / "bin" / "astrai"), "list-plugins", "--json"],
                              cwd=tmp_path).stdout)
    assert {p["name"]: p["status"] for p in plugins} == {"gae": "ok", "ppo": "ok"}

    _run([str(python), "-c", PPO_RUN, str(tmp_path)], cwd=tmp_path)
    _run([str(env_dir / "bin" / "astrai"), "train", "ppo.yaml"], cwd=tmp_path)
    records = [json.loads(line)
               for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all("critic/grad_norm" in r for r in steps)
    assert (tmp_path / "run" / "checkpoints" / "step_2" / "model.safetensors").is_file()
