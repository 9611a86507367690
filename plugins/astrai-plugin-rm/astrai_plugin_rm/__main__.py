"""``python -m astrai_plugin_rm export|import SRC DST``: see :mod:`astrai_plugin_rm.hf`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m astrai_plugin_rm",
        description="Reward models to and from Hugging Face sequence classifiers.")
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="reward-model checkpoint -> HF directory "
                                 "(AutoModelForSequenceClassification)")
    export.add_argument("src", help="reward-model checkpoint directory (strategy rm)")
    export.add_argument("dst", help="new Hugging Face directory (must not exist)")
    export.add_argument("--model-type", default=None, help="HF model_type to write")
    imported = commands.add_parser("import", help="HF sequence classifier -> reward-model "
                                   "checkpoint")
    imported.add_argument("src", help="Hugging Face directory (one-label classifier)")
    imported.add_argument("dst", help="new native reward-model directory (must not exist)")
    for sub in (export, imported):
        sub.add_argument("--importer", default=None, help="model importer to use (default: "
                         "the one for the model_type)")
    args = parser.parse_args(argv)

    from astrai_core.api import AstraiError
    from astrai_plugin_rm.hf import export_reward_model, import_reward_model

    try:
        if args.command == "export":
            out = export_reward_model(args.src, args.dst, model_type=args.model_type,
                                      importer=args.importer)
        else:
            out = import_reward_model(args.src, args.dst, importer=args.importer)
    except AstraiError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.command}ed {args.src} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
