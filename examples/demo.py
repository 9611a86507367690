"""`make demo`: the arithmetic demo and the calculator demo, their stages side by side.

Each stage trains on one thread, so the stages of both demos share the machine's cores
(``--jobs``, default: one stage per core) and their numbers are the ones each demo
prints alone. Prints both demos' tables at the end.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stages import demo_main  # noqa: E402  (examples/stages.py)


def load_demo(name: str) -> ModuleType:
    """examples/<name>/demo.py as a module (both demos are called demo.py)."""
    spec = importlib.util.spec_from_file_location(f"{name}_demo", HERE / name / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    demos = [load_demo("arith"), load_demo("calc")]

    def stages(python: str) -> list:
        return [stage for demo in demos for stage in demo.stages(python)]

    def report(seconds: dict[str, float]) -> None:
        for demo in demos:
            demo.report(seconds)

    demo_main(__doc__.splitlines()[0], stages, report)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
