"""`astrai import SRC DST [--importer NAME]`: Hugging Face checkpoint -> native checkpoint."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", type=Path, help="Hugging Face checkpoint directory")
    parser.add_argument("dst", metavar="DST", type=Path,
                        help="new native checkpoint directory (must not exist)")
    parser.add_argument("--importer", metavar="NAME", default=None,
                        help="importer to use (default: the one for config.json's model_type)")


def run(args: argparse.Namespace) -> int:
    from astrai_core.checkpoints.hf.select import importer_for_hf_dir
    from astrai_core.plugins import process_registry

    importer = importer_for_hf_dir(process_registry(), args.src, args.importer)
    destination = importer.import_checkpoint(args.src, args.dst)
    print(f"imported {args.src} -> {destination} (importer {importer.name})")
    return 0
