"""`astrai list-plugins` in a subprocess: the table, the JSON contract, and no torch."""

from __future__ import annotations

import importlib.util
import json
import subprocess

from astrai_core.testing import run_astrai



def _run(*args: str) -> subprocess.CompletedProcess:
    return run_astrai(*args, timeout=120)


def test_list_plugins_json_contract_without_importing_torch():
    result = _run("list-plugins", "--all", "--json")
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    plugins = json.loads(result.stdout)
    kinds = {"strategy", "advantage_estimator", "sampler", "model_importer", "device_backend",
             "reward_function", "policy_loss", "environment", "tracker"}
    for entry in plugins:
        assert {"name", "version", "status", "error", "provides"} <= set(entry)
        assert entry["status"] in {"ok", "error", "incompatible", "disabled"}
        assert set(entry["provides"]) <= kinds
    by_name = {entry["name"]: entry for entry in plugins}
    assert by_name["builtin"]["provides"]["device_backend"] == ["cpu", "cuda"]
    assert by_name["builtin"]["provides"]["policy_loss"] == ["cispo", "dual_clip", "gspo",
                                                             "ppo_clip"]
    assert by_name["builtin"]["provides"]["environment"] == ["single_turn", "tools"]
    assert by_name["builtin"]["provides"]["tracker"] == ["mlflow", "tensorboard", "trackio",
                                                         "wandb"]
    assert by_name["rloo"]["provides"] == {"advantage_estimator": ["rloo"]}
    for name in ("grpo", "ppo", "dpo", "distill", "gae", "qwen3", "npu", "rloo", "ray", "verifiers"):
        assert by_name[name]["status"] == "ok", by_name[name]
    # vllm is ok only where vLLM is installed; elsewhere it says how to install it
    vllm = by_name["vllm"]
    if importlib.util.find_spec("vllm") is not None:
        assert vllm["status"] == "ok", vllm
    else:
        assert vllm["status"] == "error" and "pip install vllm" in vllm["error"], vllm


def test_list_plugins_table_hides_builtins_without_all():
    result = _run("list-plugins")
    assert result.returncode == 0, result.stderr
    assert "TORCH_NOT_IMPORTED" in result.stderr
    assert "rloo" in result.stdout and "builtin" not in result.stdout
    assert "builtin" in _run("list-plugins", "--all").stdout
