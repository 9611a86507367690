"""`astrai export SRC DST`: native checkpoint -> Hugging Face directory that transformers loads."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("src", metavar="SRC", type=Path, help="native checkpoint directory")
    parser.add_argument("dst", metavar="DST", type=Path,
                        help="new Hugging Face directory (must not exist)")
    parser.add_argument("--model-type", default=None,
                        help="HF model_type to write (default: the one the checkpoint was "
                             "imported from, else derived from its architecture)")
    parser.add_argument("--importer", metavar="NAME", default=None,
                        help="importer to use (default: the one for the model_type)")


def run(args: argparse.Namespace) -> int:
    from astrai_core.checkpoints.hf.select import export_model_type, load_importer
    from astrai_core.checkpoints.hf_model import copy_hf_checkpoint, is_transformers_checkpoint
    from astrai_core.plugins import process_registry

    if is_transformers_checkpoint(args.src):  # a Hugging Face directory already
        destination = copy_hf_checkpoint(args.src, args.dst)
        print(f"exported {args.src} -> {destination} (a copy of its Hugging Face files)")
        return 0

    model_type = args.model_type or export_model_type(args.src)
    importer = load_importer(process_registry(), name=args.importer, model_type=model_type)
    destination = importer.export_checkpoint(args.src, args.dst, model_type=model_type)
    print(f"exported {args.src} -> {destination} (model_type {model_type})")
    return 0
