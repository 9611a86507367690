"""`astrai serve MODEL_DIR`: an OpenAI-compatible HTTP server (needs `pip install astrai-core[serve]`)."""

from __future__ import annotations

import argparse
import socket
from pathlib import Path

from astrai_core.cli.inference import add_verify_argument
from astrai_core.errors import AstraiError

PORT_IN_USE_EXIT = 4  # docs/user-guide.md: "exit status"


class PortInUseError(AstraiError):
    """``--host``/``--port`` cannot be bound (another server holds it)."""

    exit_code = PORT_IN_USE_EXIT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model_dir", metavar="MODEL_DIR", help="native checkpoint directory (with a tokenizer)")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--sampler", default="torch",
                        help="sampler from the registry: torch (continuous batching) or vllm")
    parser.add_argument("--served-model-name", default=None,
                        help="the model name clients send (default: MODEL_DIR's directory name)")
    parser.add_argument("--tool-call-parser", choices=("hermes", "none"), default="hermes")
    parser.add_argument("--max-batch-size", type=int, default=32, help="sequences decoded together")
    parser.add_argument("--max-seqs-per-request", type=int, default=256,
                        help="most sequences (prompts x n) one request may ask for; more: 400")
    parser.add_argument("--max-queued-seqs", type=int, default=4096,
                        help="most sequences waiting for a batch slot; a request that would "
                             "overflow it: 429 with Retry-After")
    parser.add_argument("--max-body-mb", type=float, default=4.0,
                        help="largest request body in MiB, refused (413) while it streams in (default 4)")
    parser.add_argument("--max-connections", type=int, default=256,
                        help="most open client connections; one more is answered 503 and closed (default 256)")
    parser.add_argument("--header-timeout", type=float, default=10.0,
                        help="seconds a client has to send a request's line and headers (default 10)")
    parser.add_argument("--body-timeout", type=float, default=30.0,
                        help="seconds a request body may stall between two pieces; longer: 408 (default 30)")
    parser.add_argument("--keep-alive-timeout", type=float, default=5.0,
                        help="seconds an idle keep-alive connection stays open (default 5)")
    parser.add_argument("--graceful-shutdown-timeout", type=float, default=10.0,
                        help="seconds running responses get to finish on shutdown (default 10)")
    parser.add_argument("--device", default="auto", help="device backend name (auto, cpu, cuda, ...)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op CPU threads (default: torch's choice)")
    add_verify_argument(parser)


def require_serve_extra() -> None:
    from astrai_core.errors import AstraiError

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise AstraiError("astrai serve needs FastAPI and uvicorn: pip install 'astrai-core[serve]'") from None


def build_engine(registry, sampler_name: str, model_dir: Path, device_name: str, max_batch_size: int,
                 max_queued: int | None = None, verify: bool | None = False):
    """The engine for ``--sampler``: the continuous-batching one for torch, the adapter
    otherwise; ``verify`` as ``--verify`` (None: hash a small checkpoint)."""
    from astrai_core.cli.inference import load_model_and_tokenizer

    spec = registry.get("sampler", sampler_name)  # unknown names list the available ones
    model, tokenizer = load_model_and_tokenizer(model_dir, device_name, registry, verify=verify)
    return engine_for(model, tokenizer, spec, max_batch_size, max_queued)


def engine_for(model, tokenizer, spec, max_batch_size: int, max_queued: int | None = None):
    """The serving engine of a loaded model with the sampler of ``spec``: the native
    continuous-batching engine for the torch sampler on a native model, else the sampler
    behind the generic adapter (a transformers-backend model too: the batching engine
    edits the native KV cache in place)."""
    from astrai_core.model_backends.transformers_lm import is_transformers_model

    if spec.name == "torch" and not is_transformers_model(model):
        from astrai_core.serving.engine import BatchingEngine

        return BatchingEngine(model, tokenizer, max_batch_size=max_batch_size, max_queued=max_queued)
    from astrai_core.serving.sampler_engine import SamplerEngine

    sampler = spec.load()(model=model, tokenizer=tokenizer)  # the sampler contract: a live model
    return SamplerEngine(sampler, tokenizer, max_context=int(model.config.max_position_embeddings),
                         vocab_size=int(model.config.vocab_size), max_batch_size=max_batch_size,
                         max_queued=max_queued)


def _check_numbers(args: argparse.Namespace) -> None:
    """One clear error naming the option for a count or limit that cannot work."""
    for flag in ("max_batch_size", "max_seqs_per_request", "max_queued_seqs", "max_connections"):
        if getattr(args, flag) < 1:
            raise AstraiError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    for flag in ("max_body_mb", "header_timeout", "body_timeout", "keep_alive_timeout",
                 "graceful_shutdown_timeout"):
        if not getattr(args, flag) > 0:
            raise AstraiError(f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}")
    if args.max_seqs_per_request > args.max_queued_seqs:  # such a request could never be queued
        raise AstraiError(f"--max-seqs-per-request ({args.max_seqs_per_request}) must not exceed "
                          f"--max-queued-seqs ({args.max_queued_seqs})")


def serve_limits(args: argparse.Namespace):
    """The :class:`~astrai_core.serving.limits.ServeLimits` the options ask for."""
    from astrai_core.serving.limits import MIB, ServeLimits

    return ServeLimits(max_body_bytes=max(1, int(args.max_body_mb * MIB)), body_timeout=args.body_timeout,
                       header_timeout=args.header_timeout, keep_alive_timeout=args.keep_alive_timeout,
                       max_connections=args.max_connections,
                       graceful_shutdown_timeout=args.graceful_shutdown_timeout)


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` once, the way uvicorn will (SO_REUSEADDR), and let it go: a busy
    port is one error line before the model loads, not uvicorn's startup failure after."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise PortInUseError(f"--port {port}: cannot listen on {host}:{port} "
                                 f"({exc.strerror or exc}); pick another --port") from None


def run(args: argparse.Namespace) -> int:
    require_serve_extra()
    import uvicorn

    from astrai_core.plugins import process_registry
    from astrai_core.serving.app import create_app
    from astrai_core.serving.connections import server_config

    model_dir = Path(args.model_dir)
    _check_numbers(args)
    limits = serve_limits(args)
    check_port_free(args.host, args.port)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    registry = process_registry()  # once: the sampler and the device backend come from it
    engine = build_engine(registry, args.sampler, model_dir, args.device, args.max_batch_size,
                          args.max_queued_seqs, verify=args.verify)
    name = args.served_model_name or model_dir.resolve().name
    parser = None if args.tool_call_parser == "none" else args.tool_call_parser
    app = create_app(engine, model_name=name, tool_call_parser=parser,
                     max_seqs_per_request=args.max_seqs_per_request, limits=limits)
    try:
        uvicorn.Server(server_config(app, limits, host=args.host, port=args.port, log_level="info")).run()
    finally:
        engine.close()
    return 0
