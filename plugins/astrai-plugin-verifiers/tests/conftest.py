"""The tests' verifiers environments live beside them (``verifiers_test_envs``,
``verifiers_tool_env``): verifiers imports tasksets by module name, and runs a task's tool
server as ``python -m MODULE``, so this directory goes on ``sys.path`` and ``PYTHONPATH``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))


@pytest.fixture(autouse=True)
def _importable_environments(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(HERE), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")

