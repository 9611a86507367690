"""Online GRPO runs with the ray sampler: on-policy it logs what the local sampler logs;
with rollout.max_staleness 1 it samples ahead, never more than one step; a worker that
dies stops the run with an error naming it, never a hang."""

from __future__ import annotations

import pytest

from astrai_core.api import ConfigError, RunConfig
from astrai_core.testing import read_metrics, tiny_run_config, write_arith_prompts

GRPO = {"name": "grpo", "group_size": 4}
RAY = {"name": "ray", "workers": 2, "worker_sampler": {"name": "torch"}}
TIMING = ("time/", "throughput/", "rollout/weight_push")


def _train(tmp_path, sampler=None, rollout=None, steps=4):
    from astrai_core.training.run import train

    tmp_path.mkdir(parents=True, exist_ok=True)
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=32)
    config = tiny_run_config(tmp_path, prompts, GRPO, sampler=sampler, max_steps=steps,
                             data={"batch_size": 4})
    if rollout is not None:
        config["rollout"] = rollout
    train(RunConfig.model_validate(config))
    return read_metrics(tmp_path / "run")


def _without_timing(row):
    return {k: v for k, v in row.items() if not k.startswith(TIMING)}


def test_on_policy_ray_run_logs_the_local_samplers_metrics(ray_session, tmp_path):
    local = _train(tmp_path / "local")
    remote = _train(tmp_path / "ray", sampler=RAY)
    assert [r["step"] for r in remote] == [1, 2, 3, 4]
    assert all(r["rollout/staleness"] == 0 for r in remote)
    assert all(r["rollout/weight_push_mb"] > 0 for r in remote)  # every step pushed
    assert any(r["grad_norm"] > 0 for r in local)  # the policy moved: pushes mattered
    for mine, theirs in zip(remote, local):
        mine, theirs = _without_timing(mine), _without_timing(theirs)
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_a_run_with_delta_pushes_logs_the_local_samplers_metrics(ray_session, tmp_path):
    """``push: delta`` through the run config: every push checked on arrival, and the
    workers sample exactly what the local sampler samples, step after step."""
    local = _train(tmp_path / "local", steps=3)
    remote = _train(tmp_path / "ray", sampler={**RAY, "push": "delta"}, steps=3)
    assert all(r["rollout/weight_push_full_mb"] > 0 for r in remote)  # the delta push ran
    for mine, theirs in zip(remote, local, strict=True):
        mine, theirs = _without_timing(mine), _without_timing(theirs)
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


def test_staleness_one_with_a_slow_worker_stays_within_one_step(ray_session, tmp_path):
    slow = {**RAY, "worker_sampler": {"name": "slow_torch", "delay_s": 0.3}}
    rows = _train(tmp_path, sampler=slow, rollout={"max_staleness": 1}, steps=5)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]  # training proceeded
    staleness = [r["rollout/staleness"] for r in rows]
    assert staleness == [0, 1, 1, 1, 1]  # the first rollout has no older policy to come from
    # rollout t+1 was requested before step t trained, so it came from policy t-1
    assert [r["rollout/policy_version"] for r in rows] == [0, 0, 1, 2, 3]


def test_overlapped_partial_rollouts_train_on_tokens_of_several_versions(ray_session, tmp_path):
    """rollout.partial on Ray workers overlaps by default (the worker decodes while the
    trainer steps; test_ray_partial_overlap.py checks the interrupts token by token): a
    run trains within max_staleness on tokens of several versions."""
    from astrai_core.training.run import train

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=32)
    config = tiny_run_config(
        tmp_path, prompts, {**GRPO, "rollout_correction": {"level": "token", "threshold": 100.0}},
        sampler={**RAY, "workers": 1, "worker_sampler": {"name": "slow_step_torch",
                                                        "token_delay_s": 0.004},
                 "max_new_tokens": 24, "stop_token_ids": list(range(8, 12))},
        max_steps=5, data={"batch_size": 2})
    config["rollout"] = {"partial": True, "max_staleness": 2, "partial_tokens": 24}
    train(RunConfig.model_validate(config))
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # sampled ahead of the trainer: rollouts hold tokens of older and newer versions
    assert any(r["rollout/staleness"] > r["rollout/staleness_min"] for r in rows)
    assert all(r["rollout/staleness"] <= 2 for r in rows)
    assert all(r["loss"] == r["loss"] for r in rows)  # finite


def test_a_dying_worker_stops_the_run_with_its_name_and_node(ray_session, tmp_path):
    from astrai_plugin_ray.workers import RolloutWorkerDied

    dying = {**RAY, "worker_sampler": {"name": "dying_torch", "die_at_call": 3}}
    with pytest.raises(RolloutWorkerDied) as raised:
        _train(tmp_path, sampler=dying, steps=4)
    message = str(raised.value)
    ip = ray_session.util.get_node_ip_address()
    assert "rollout worker 0 of 2" in message and f"on node {ip}" in message
    assert "died during generate" in message and "--resume" in message
    assert len(read_metrics(tmp_path / "run")) == 2  # two steps ran before the third rollout
    # the run let go of its workers: every placement group it made is removed
    table = ray_session.util.placement_group_table()
    assert table and all(group["state"] == "REMOVED" for group in table.values())


def test_staleness_needs_an_asynchronous_sampler(tmp_path):
    from astrai_core.config.plan import plan_run

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, GRPO)
    config["rollout"] = {"max_staleness": 1}
    with pytest.raises(ConfigError, match=r"rollout\.max_staleness: sampler 'torch' generates "
                       r"inside the trainer's process.*samplers that allow it: ray"):
        plan_run(RunConfig.model_validate(config))
    config["sampler"] = {**config["sampler"], **RAY}
    config["strategy"] = {**GRPO, "recompute_old_logprobs": True}
    with pytest.raises(ConfigError, match="strategy.recompute_old_logprobs: with rollout"):
        plan_run(RunConfig.model_validate(config))


def test_worker_sampler_is_checked_and_its_sampling_fields_lifted(tmp_path):
    from astrai_core.config.plan import plan_run

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, GRPO)
    config["sampler"] = {"name": "ray", "worker_sampler": {"name": "torch", "max_new_tokens": 7,
                                                           "max_batch_size": 3}}
    plan = plan_run(RunConfig.model_validate(config))
    fields, engine = plan.sampling_fields()
    assert fields["max_new_tokens"] == 7
    assert engine["worker_sampler"] == {"name": "torch", "max_batch_size": 3}
    config["sampler"]["worker_sampler"] = {"name": "nope"}
    with pytest.raises(ConfigError, match="sampler.worker_sampler.*nope"):
        plan_run(RunConfig.model_validate(config))
    config["sampler"]["worker_sampler"] = {"name": "torch", "max_batchsize": 3}
    with pytest.raises(ConfigError, match="worker_sampler.*max_batchsize: Extra inputs"):
        plan_run(RunConfig.model_validate(config))


def test_astrai_train_joins_the_cluster_at_ray_address_and_leaves_it_running(ray_session,
                                                                            tmp_path):
    """A run given RAY_ADDRESS joins that cluster (it does not start its own Ray) and, at
    its end, removes its workers but leaves the cluster up."""
    import json
    import os
    import subprocess
    import sys

    import yaml

    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=16)
    config = tiny_run_config(tmp_path, prompts, GRPO, sampler=RAY, max_steps=2,
                             data={"batch_size": 4})
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(config))
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address}
    result = subprocess.run([sys.executable, "-m", "astrai_core.cli.main", "train",
                             str(tmp_path / "run.yaml")], env=env, capture_output=True,
                            text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Started a local Ray instance" not in result.stderr
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert ray_session.cluster_resources()["CPU"] == 2  # the cluster lives on
    table = ray_session.util.placement_group_table()
    assert all(group["state"] == "REMOVED" for group in table.values())


def test_partial_rollouts_on_ray_workers_equal_the_local_sampler(ray_session, tmp_path):
    """rollout.partial with Ray workers: carried sequences continue on the workers under
    the pushed weights exactly as under the local torch sampler."""
    from astrai_core.training.run import train

    def run(name, sampler):
        config = tiny_run_config(
            tmp_path / name, write_arith_prompts(tmp_path / "prompts.jsonl", count=32),
            {**GRPO, "rollout_correction": {"level": "token", "threshold": 100.0}},
            sampler={"max_new_tokens": 8, "stop_token_ids": list(range(8, 24)), **sampler},
            max_steps=4, data={"batch_size": 2})
        # segments only while the trainer waits: the same tokens wherever they are sampled
        config["rollout"] = {"partial": True, "max_staleness": 1, "partial_tokens": 2,
                             "partial_overlap": False}
        train(RunConfig.model_validate(config))
        return read_metrics(tmp_path / name / "run")

    local, remote = run("local", {}), run("ray", RAY)
    assert any(r["rollout/staleness"] > 0 for r in local)  # sequences were carried
    for mine, theirs in zip(remote, local, strict=True):
        mine, theirs = _without_timing(mine), _without_timing(theirs)
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
