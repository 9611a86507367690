"""`astrai manifest DIR`: write manifest.json for a checkpoint directory whose files you trust.

Every checkpoint astrai writes has a manifest; one written by an older astrai (or put
together by hand) has none, and is refused until its owner vouches for its files this way.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR", type=Path, help="checkpoint directory")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing manifest.json (the files changed on purpose)")


def run(args: argparse.Namespace) -> int:
    from astrai_core.checkpoints.manifest import MANIFEST_FILE, write_manifest
    from astrai_core.checkpoints.native_files import load_config
    from astrai_core.errors import CheckpointError

    load_config(args.directory)  # a checkpoint directory at all (clear message otherwise)
    if (args.directory / MANIFEST_FILE).exists() and not args.force:
        raise CheckpointError(f"{args.directory / MANIFEST_FILE} already exists; pass --force "
                              "to record the files as they are now")
    path = write_manifest(args.directory)
    print(f"wrote {path}: every file of {args.directory} as it is now is accepted")
    return 0
