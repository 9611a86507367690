"""`astrai train CONFIG.yaml [--set a.b=v ...] [--resume] [--nproc-per-node N ...]`.

With ``--nproc-per-node`` the command launches the run itself through torchrun's
``torch.distributed.run`` (one process per device, ``--nnodes`` machines); each process
runs this same command without the launch options (see docs/distributed.md).
"""

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
    launch = parser.add_argument_group("distributed launch (torchrun)")
    launch.add_argument("--nproc-per-node", type=int, metavar="N",
                        help="processes on this machine (one per device); launches the run")
    launch.add_argument("--nnodes", type=int, default=1, metavar="M", help="machines (default 1)")
    launch.add_argument("--node-rank", type=int, default=0, metavar="R",
                        help="this machine's index, 0..M-1")
    launch.add_argument("--master-addr", metavar="HOST", help="address of the node-rank-0 machine")
    launch.add_argument("--master-port", type=int, metavar="PORT",
                        help="a free port on the node-rank-0 machine")


def run(args: argparse.Namespace) -> int:
    from astrai_core.config import read_config
    from astrai_core.errors import ConfigError

    if args.resume and args.overwrite:
        raise ConfigError("--resume and --overwrite contradict each other; choose one")
    loaded = read_config(args.config, args.overrides)
    if args.nproc_per_node is not None:
        from astrai_core.cli.launch import launch

        return launch(args, loaded)
    from astrai_core.cli.launch import worker_errors
    from astrai_core.training.run import train

    with worker_errors():
        train(loaded.config, source=loaded.source, resume=args.resume, overwrite=args.overwrite,
              phase_hook=getattr(args, "phase_hook", None))
    return 0
