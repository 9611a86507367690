"""`make demo`: the arithmetic demo and the calculator demo, their stages side by side.

Each stage trains on one thread, so the stages of both demos share the machine's cores
(``--jobs``, default: one stage per core) and their numbers are the ones each demo
prints alone. Prints both demos' tables at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from stages import run_stages  # noqa: E402  (examples/stages.py)


def load_demo(name: str) -> ModuleType:
    """examples/<name>/demo.py as a module (both demos are called demo.py)."""
    spec = importlib.util.spec_from_file_location(f"{name}_demo", HERE / name / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=None,
                        help="stages run at once (default: the number of cores)")
    args = parser.parse_args()
    demos = [load_demo("arith"), load_demo("calc")]
    seconds = run_stages([stage for demo in demos for stage in demo.stages(sys.executable)],
                         args.jobs)
    for demo in demos:
        demo.report(seconds)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
