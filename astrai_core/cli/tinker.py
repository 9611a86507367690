"""`astrai tinker --model NAME=PATH`: a local server for the official Tinker SDK (astrai-core[serve]).

Clients set ``base_url`` (or ``TINKER_BASE_URL``) to this server; each gets its own LoRA
adapter and optimizer on the one base model held in memory.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from pathlib import Path
from typing import Any

from astrai_core.cli.serve import check_port_free, require_serve_extra
from astrai_core.errors import AstraiError

API_KEY_ENV = "ASTRAI_TINKER_API_KEY"
MIB = 1 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", action="append", default=[], metavar="NAME=PATH", required=True,
                        help="a base model clients ask for by NAME (e.g. Qwen/Qwen3-8B), from PATH: a "
                             "native checkpoint, a Hugging Face directory or hub id (repeatable)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=None,
                        help=f"the key clients send (starts with 'tml-'; default: ${API_KEY_ENV}); "
                             "required when --host is not a loopback address")
    parser.add_argument("--state-dir", default="tinker-state",
                        help="where checkpoints (tinker:// paths) are written (default ./tinker-state)")
    parser.add_argument("--max-adapters", type=int, default=16, help="LoRA adapters held at once")
    parser.add_argument("--max-datums", type=int, default=1024, help="datums in one request")
    parser.add_argument("--max-datum-tokens", type=int, default=None,
                        help="tokens in one datum (default: the base model's context length)")
    parser.add_argument("--max-body-mb", type=float, default=64.0, help="largest request body in MiB")
    parser.add_argument("--sampler", default="torch",
                        help="who samples: torch (astrai's sampler, default) or vllm (one vLLM "
                             "engine per base serving every tenant's adapter; needs vLLM)")
    parser.add_argument("--sampler-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an engine option of --sampler vllm, e.g. gpu_memory_utilization=0.4 "
                             "(VALUE read as JSON where it parses; repeatable)")
    parser.add_argument("--device", default="auto", help="device backend name (auto, cpu, cuda, ...)")
    parser.add_argument("--nproc-per-node", type=int, metavar="N", default=None,
                        help="serve from N processes (one per device) with each base model "
                             "sharded over them (FSDP2); rank 0 serves HTTP")


def parse_models(specs: list[str]) -> dict[str, str]:
    """``NAME=PATH`` pairs; a PATH that looks local must exist (a hub id is ``org/name``)."""
    models: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise AstraiError(f"--model {spec!r}: expected NAME=PATH, e.g. Qwen/Qwen3-8B=./qwen3-8b")
        if name in models:
            raise AstraiError(f"--model {name!r} is given twice")
        local = Path(path).expanduser()
        looks_local = path.startswith((".", "/", "~")) or path.count("/") != 1
        if looks_local and not local.exists():
            raise AstraiError(f"--model {name}={path}: {local} does not exist")
        models[name] = str(local) if local.exists() else path
    return models


def parse_sampler_options(specs: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs, each VALUE a JSON value where it parses (else the string)."""
    import json

    options: dict[str, Any] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip().isidentifier():
            raise AstraiError(f"--sampler-option {spec!r}: expected KEY=VALUE, e.g. "
                              "gpu_memory_utilization=0.4")
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def resolve_api_key(args: argparse.Namespace) -> str | None:
    key = args.api_key or os.environ.get(API_KEY_ENV) or None
    if key is not None and not key.startswith("tml-"):
        raise AstraiError("--api-key must start with 'tml-' (the Tinker SDK refuses other keys)")
    if key is None and not _is_loopback(args.host):
        raise AstraiError(f"--host {args.host} is reachable from other machines: set --api-key "
                          f"(or ${API_KEY_ENV}), or bind 127.0.0.1")
    return key


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def limits_of(args: argparse.Namespace):
    from astrai_core.tinker.service import Limits

    for flag in ("max_adapters", "max_datums"):
        if getattr(args, flag) < 1:
            raise AstraiError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.max_datum_tokens is not None and args.max_datum_tokens < 1:
        raise AstraiError(f"--max-datum-tokens must be >= 1, got {args.max_datum_tokens}")
    if not args.max_body_mb > 0:
        raise AstraiError(f"--max-body-mb must be > 0, got {args.max_body_mb}")
    return Limits(max_adapters=args.max_adapters, max_body_bytes=int(args.max_body_mb * MIB),
                  max_datums=args.max_datums, max_datum_tokens=args.max_datum_tokens)


def build_engine(models: dict[str, str], state_dir: Path, args: argparse.Namespace,
                 device: Any = None):
    """The torch engine holding each ``--model`` once on ``device`` (default: ``--device``'s),
    saving under ``state_dir``."""
    from astrai_core.tinker.engine import EngineLimits
    from astrai_core.tinker.engine import build_engine as build

    if device is None:
        device = device_backend(args).device()
    limits = EngineLimits(max_adapters=args.max_adapters, max_datums=args.max_datums,
                          max_tokens_per_datum=args.max_datum_tokens)
    return build(models, state_dir, device=device, limits=limits)


def device_backend(args: argparse.Namespace) -> Any:
    from astrai_core.devices.select import resolve_device
    from astrai_core.plugins import process_registry

    return resolve_device(process_registry(), args.device)


def http_server(engine: Any, args: argparse.Namespace, api_key: str | None, limits: Any,
                state_dir: Path) -> Any:
    """The uvicorn server of the Tinker app on ``engine``, on ``--host``/``--port``."""
    import uvicorn

    from astrai_core.tinker.app import create_app

    app = create_app(engine, api_key=api_key, limits=limits, state_dir=state_dir)
    # long polls end within seconds: a stop does not wait on them for long
    return uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="info",
                                         timeout_graceful_shutdown=5))


def run(args: argparse.Namespace) -> int:
    require_serve_extra()
    from astrai_core.distributed.world import launched_world_size

    models = parse_models(args.model)
    api_key = resolve_api_key(args)
    limits = limits_of(args)
    state_dir = Path(args.state_dir).expanduser()
    sampler_options = parse_sampler_options(args.sampler_option)
    if sampler_options and args.sampler == "torch":
        raise AstraiError("--sampler-option: the torch sampler takes no engine options")
    if args.sampler != "torch" and (args.nproc_per_node is not None
                                    or launched_world_size() > 1):
        raise AstraiError(f"--sampler {args.sampler} serves from one process; leave out "
                          "--nproc-per-node or use --sampler torch")
    if args.nproc_per_node is not None:
        from astrai_core.cli.tinker_ranks import launch

        return launch(args, state_dir, {API_KEY_ENV: api_key} if api_key else {})
    if launched_world_size() > 1:  # one of the processes `--nproc-per-node` started
        from astrai_core.cli.tinker_ranks import serve_rank

        return serve_rank(device_backend(args),
                          lambda device: build_engine(models, state_dir, args, device),
                          lambda engine: http_server(engine, args, api_key, limits, state_dir))
    check_port_free(args.host, args.port)
    if args.sampler != "torch":  # unavailable: one line before any model loads
        from astrai_core.tinker.sample_backends import adapter_sampler

        adapter_sampler(args.sampler, sampler_options)
    state_dir.mkdir(parents=True, exist_ok=True)
    engine = build_engine(models, state_dir, args)
    if args.sampler != "torch":
        from astrai_core.tinker.sample_backends import registry_backend

        engine.backend = registry_backend(args.sampler, list(engine.bases.values()),
                                          engine.limits.max_sampler_adapters, sampler_options)
    try:
        http_server(engine, args, api_key, limits, state_dir).run()
    finally:
        engine.backend.close()
    return 0
