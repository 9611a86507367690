"""`astrai export SRC DST`: native checkpoint -> Hugging Face directory that transformers loads.

A checkpoint whose strategy names an exporter in its spec (``StrategySpec.exporter``: a
reward model's score head is more than a causal LM) goes to that exporter; the strategy
comes from the checkpoint's ``strategy.json``
(:mod:`astrai_core.checkpoints.strategy_record`). Every other checkpoint is a causal LM,
written by the model importer of its ``model_type`` (a PPO checkpoint: the policy; its
critic is training state).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


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

    registry = process_registry()
    exporter, strategy = strategy_exporter(registry, args.src)
    if exporter is not None:  # more than a causal LM: the strategy's plugin exports it
        destination = exporter(args.src, args.dst, model_type=args.model_type,
                               importer=args.importer)
        print(f"exported {args.src} -> {destination} (the exporter of strategy {strategy!r})")
        return 0
    if is_transformers_checkpoint(args.src):  # a Hugging Face directory already
        destination = copy_hf_checkpoint(args.src, args.dst)
        print(f"exported {args.src} -> {destination} (a copy of its Hugging Face files)")
        return 0

    model_type = args.model_type or export_model_type(args.src)
    importer = load_importer(registry, name=args.importer, model_type=model_type)
    destination = importer.export_checkpoint(args.src, args.dst, model_type=model_type)
    print(f"exported {args.src} -> {destination} (model_type {model_type})")
    return 0


def strategy_exporter(registry: Any, src: Path) -> tuple[Any, str | None]:
    """(the exporter of the strategy ``src`` records, or None; that strategy). A strategy no
    installed plugin provides is an error: whether its checkpoints are plain causal LMs
    is the plugin's to say."""
    from astrai_core.checkpoints.strategy_record import read_strategy_record
    from astrai_core.errors import CheckpointError, UnknownComponentError

    strategy = read_strategy_record(src)
    if strategy is None:
        return None, None
    try:
        spec = registry.get("strategy", strategy)
    except UnknownComponentError as exc:
        raise CheckpointError(f"{src} was trained with strategy {strategy!r}, whose plugin "
                              f"says how to export it: {exc}") from None
    return spec.load_exporter(), strategy
