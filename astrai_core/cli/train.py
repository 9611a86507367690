"""`astrai train CONFIG.yaml [--set a.b=v ...] [--resume]`."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config (YAML)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY.PATH=VALUE", help="override a config value (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest complete checkpoint in output_dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an output_dir that already holds checkpoints or metrics")


def run(args: argparse.Namespace) -> int:
    from astrai_core.config import read_config
    from astrai_core.errors import ConfigError

    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; choose one")
    loaded = read_config(args.config, args.overrides)
    from astrai_core.training.run import train

    train(loaded.config, source=loaded.source, resume=args.resume, overwrite=args.overwrite)
    return 0
