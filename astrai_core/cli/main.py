"""Entry point of the `astrai` console script.

argparse (standard library) parses the command line: it adds no dependency and no
import time, and each command's heavy modules are imported only when that command
runs, so `astrai list-plugins` never imports torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from astrai_core.version import __version__
from astrai_core.distributed.worker_report import launched_worker, record_error
from astrai_core.errors import AstraiError
from astrai_core.log import configure_logging

# command -> (module under astrai_core.cli, one-line help). Each module defines
# add_arguments(parser) and run(args) and imports heavy things (torch) inside run().
COMMANDS: dict[str, tuple[str, str]] = {
    "list-plugins": ("list_plugins", "list installed plugins and what each provides"),
    "describe": ("describe", "show component kinds, a kind's components, a component's options"),
    "generate": ("generate", "sample from a checkpoint, streaming to the terminal"),
    "train": ("train", "run training from a YAML config"),
    "eval": ("eval_cmd", "score a checkpoint on a prompt set: accuracy, mean reward, pass@k"),
    "plot": ("plot", "draw PNG curves of a run's metrics.jsonl"),
    "import": ("import_cmd", "Hugging Face checkpoint directory -> native checkpoint directory"),
    "export": ("export_cmd", "native checkpoint -> Hugging Face directory that transformers loads"),
    "serve": ("serve", "OpenAI-compatible HTTP server (astrai-core[serve])"),
    "tinker": ("tinker", "local server for the Tinker SDK: LoRA tenants on one base (astrai-core[serve])"),
    "manifest": ("manifest_cmd", "accept a checkpoint without manifest.json (older astrai)"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="astrai", description="astrai: LLM training and RL")
    parser.add_argument("--version", action="version", version=f"astrai {__version__}")
    parser.add_argument("--log-format", choices=("auto", "console", "json"), default="auto",
                        help="console on a terminal, JSON lines otherwise (auto)")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"))
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command, (module_name, help_text) in COMMANDS.items():
        sub = commands.add_parser(command, help=help_text, description=help_text)
        sub.set_defaults(_module=module_name)
        _command_module(module_name).add_arguments(sub)
    return parser


def _command_module(module_name: str):
    return importlib.import_module(f"astrai_core.cli.{module_name}")


def main(argv: Sequence[str] | None = None, *,
         embedding: Mapping[str, Any] | None = None) -> int:
    """Run the command of ``argv``. ``embedding`` is for a program that wraps the CLI (the
    test kit's fault driver): its items become attributes of the parsed arguments, such
    as ``phase_hook`` (handed to the trainer) and ``worker_module`` (what a distributed
    launch starts in each process: a module and its leading arguments)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    vars(args).update(embedding or {})
    configure_logging(args.log_format, args.log_level)
    try:
        result = _command_module(args._module).run(args)
        sys.stdout.flush()  # inside the try: a closed pipe is reported here, not at exit
    except AstraiError as error:
        print(f"error: {_rank_prefix()}{error}", file=sys.stderr)
        record_error(_first_line(error))  # a distributed launcher repeats it in its last line
        _exit_worker(error.exit_code)  # before teardown closes its sockets: see there
        raise SystemExit(error.exit_code) from None
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        raise SystemExit(130) from None
    except BrokenPipeError:  # `astrai ... | head`: the reader left; stop quietly
        _silence_stdout()
        raise SystemExit(141) from None
    except Exception as error:  # a bug: its traceback follows, its last line to the launcher
        record_error(f"{type(error).__name__}: {_first_line(error)}")
        raise
    _exit_worker(result or 0)
    raise SystemExit(result or 0)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else ""


def _exit_worker(code: int) -> None:
    """A torchrun worker that finished, or failed with its own error, leaves with
    ``os._exit``, after flushing: with torch 2.13's gloo, the interpreter's teardown
    sometimes aborts the process ("terminate called without an active exception", signal
    6) after the run completed, even with the process group destroyed, which torchrun then
    reports as a failed run. And a failed rank's teardown closes its gloo sockets before
    the process ends: its peer aborts at once, and torchrun stops the failed rank with
    SIGTERM while it is still exiting, hiding its exit status. Everything the run owns
    (checkpoints, metrics, trackers, samplers) is closed by then."""
    import os

    if not launched_worker():
        return
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_prefix() -> str:
    """``[rank R] `` inside a distributed run (which process failed), else nothing."""
    import os

    return f"[rank {os.environ['RANK']}] " if int(os.environ.get("WORLD_SIZE", "1")) > 1 else ""


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot raise again."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    main()
