"""Build the sdist and wheel of every distribution of this repository (`make dist`).

    python tools/build_dists.py [--out dist] [--expect-version 0.2.0]

Distributions: astrai-core (the root), each plugins/*/ and each contrib/*/ with a
pyproject.toml. Each is built with `python -m build --no-isolation` (the wheel from the
sdist, which proves the sdist is complete), so this runs offline with the setuptools of
the current environment. Everything is built in a directory beside ``--out`` and moved
into place only when every distribution built: a failure leaves the old ``--out`` as it
was.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def distribution_dirs(repo: Path = REPO) -> list[Path]:
    """The root, then every plugin and contrib directory holding a pyproject.toml."""
    found = [repo]
    for group in ("plugins", "contrib"):
        found += sorted(p.parent for p in (repo / group).glob("*/pyproject.toml"))
    return found


def build_all(out: Path, repo: Path = REPO) -> list[Path]:
    """Build every distribution into ``out`` (replaced whole); returns the files built."""
    out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for directory in distribution_dirs(repo):
            _build(directory, staging)
        previous = out.with_name(f".{out.name}-old")
        if out.exists():
            out.rename(previous)
        staging.rename(out)
        shutil.rmtree(previous, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sorted(out.iterdir())


def _build(directory: Path, out: Path) -> None:
    print(f"building {directory.relative_to(REPO) if directory != REPO else '.'}", flush=True)
    result = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(directory)],
        capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"building {directory} failed")
    shutil.rmtree(directory / "build", ignore_errors=True)  # setuptools' scratch space


def versions(files: list[Path]) -> dict[str, str]:
    """``{distribution: version}`` read from the built file names.

    Fails on an sdist name that is not normalized (``astrai_core-0.1.0.tar.gz``, PEP 625):
    PyPI refuses those, and only setuptools older than 69.3 writes them.
    """
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

    found = {}
    for path in files:
        if path.name.endswith(".whl"):
            name, version, *_ = parse_wheel_filename(path.name)
        else:
            name, version = parse_sdist_filename(path.name)
            if not path.name.startswith(f"{canonicalize_name(name).replace('-', '_')}-"):
                raise SystemExit(f"{path.name}: sdist name not normalized (PEP 625); "
                                 "build with setuptools>=69.3")
        found[str(name)] = str(version)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dist")
    parser.add_argument("--expect-version", help="fail unless every distribution has it "
                        "(a release tag v0.2.0 expects 0.2.0)")
    args = parser.parse_args(argv)
    files = build_all(args.out)
    for path in files:
        print(f"  {path.name}")
    wrong = {name: v for name, v in versions(files).items()
             if args.expect_version and v != args.expect_version.removeprefix("v")}
    if wrong:
        print(f"error: expected version {args.expect_version} everywhere; got {wrong}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
