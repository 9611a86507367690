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
