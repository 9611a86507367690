"""One local Ray (num_cpus=2) per test module, whose workers also load this directory's
test samplers (``ray_test_samplers``) as a plugin, as the test process does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
HERE = Path(__file__).resolve().parent
PLUGIN = "ray_test_samplers"


@pytest.fixture(scope="module")
def ray_session():
    import ray

    with pytest.MonkeyPatch.context() as patch:
        # Set before ray.init: the raylet, and so every worker, inherits them.
        patch.setenv("PYTHONPATH", os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
        patch.setenv("ASTRAI_PLUGINS", PLUGIN)
        patch.syspath_prepend(str(HERE))
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            yield ray
        finally:
            ray.shutdown()
            sys.modules.pop(PLUGIN, None)


# Metrics that measure time or the weight push: a ray run's differ from a local run's
TIMING = ("time/", "throughput/", "rollout/weight_push")


def _logs_match(remote: list[dict], local: list[dict]) -> None:
    """Every step of ``remote`` logs the metrics of ``local``'s, timing aside, within
    float noise."""
    assert len(remote) == len(local)
    for mine, theirs in zip(remote, local):
        mine = {k: v for k, v in mine.items() if not k.startswith(TIMING)}
        theirs = {k: v for k, v in theirs.items() if not k.startswith(TIMING)}
        assert mine.keys() == theirs.keys()
        for key, value in theirs.items():
            assert mine[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key


@pytest.fixture
def assert_logs_match():
    """``assert_logs_match(remote, local)``: a ray run's metrics are the local run's."""
    return _logs_match
