"""The built-in ``python`` tool: run a program in the sandbox, answer with its output.

``environment: {name: tools, tools: [python]}`` (the short name; the target is
``astrai_core.environments.python_tool:python``). Each call runs its ``code`` in a fresh
sandbox (:mod:`astrai_core.environments.sandbox`) with the default limits (2 s wall, 2 s
CPU, 512 MiB, no network) and returns stdout, stderr and the exit status as one text cut
to 2000 characters. Nothing persists between calls: each is a new interpreter in a new
temporary directory. For other limits write your own tool in three lines::

    _box = Sandbox(timeout=10, memory_mb=2048)
    def python(code: str) -> str:
        \"\"\"Run a Python program and return its output.\"\"\"
        return _box.run_python(code).summary()
"""

from __future__ import annotations

from astrai_core.environments.sandbox import Sandbox

MAX_RESULT_CHARS = 2000
_SANDBOX = Sandbox()


def python(code: str) -> str:
    """Run a Python program in a sandbox (no network, no state kept between calls) and
    return its stdout, stderr and exit status; print what you want to see."""
    return _SANDBOX.run_python(code).summary(MAX_RESULT_CHARS)
