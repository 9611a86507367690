"""Training routes: create a LoRA model, forward/backward, optimizer steps, weights."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from astrai_core.tinker import paths
from astrai_core.tinker.engine_types import AdamSpec, DatumIn, EngineRequestError, LoraSpec
from astrai_core.tinker.http_json import read_body, read_json
from astrai_core.tinker.futures import PROTO, Payload, json_payload
from astrai_core.tinker.service import ModelRecord, TinkerService
from astrai_core.tinker.wire_fwdbwd import decode_request, encode_output

_ADAM_FIELDS = ("learning_rate", "beta1", "beta2", "eps", "weight_decay", "grad_clip_norm")


def check_datums(record: ModelRecord, datums: list[DatumIn], max_datums: int,
                 max_tokens: int | None) -> None:
    """Limits, token ids in the vocabulary, loss inputs one entry per input token."""
    base = record.base
    if not datums:
        raise EngineRequestError("no datums in the request")
    if len(datums) > max_datums:
        raise EngineRequestError(f"{len(datums)} datums in one request; the limit is {max_datums}")
    limit = min(max_tokens or base.max_context, base.max_context)
    for i, datum in enumerate(datums):
        if not datum.tokens or len(datum.tokens) > limit:
            raise EngineRequestError(f"datum {i}: {len(datum.tokens)} tokens; 1 to {limit} allowed")
        bad = [t for t in datum.tokens if not 0 <= t < base.vocab_size]
        targets = datum.loss_fn_inputs.get("target_tokens")
        if targets is not None:
            bad += [int(t) for t in targets.reshape(-1) if not 0 <= t < base.vocab_size]
        if bad:
            raise EngineRequestError(f"datum {i}: token id {bad[0]} is out of range for {base.name} "
                                     f"(vocabulary of {base.vocab_size})")
        for name, arr in datum.loss_fn_inputs.items():
            if arr.ndim == 0 or arr.shape[0] != len(datum.tokens):
                raise EngineRequestError(f"datum {i}: loss_fn_inputs[{name!r}] has shape {list(arr.shape)}; "
                                         f"its first dimension must be the input's length {len(datum.tokens)}")


def _model_seq(body: dict[str, Any]) -> tuple[str, int] | None:
    seq = body.get("seq_id")
    return None if seq is None else (str(body.get("model_id")), int(seq))


def register(app: FastAPI, state: dict[str, TinkerService]) -> None:
    _register_models(app, state)
    _register_steps(app, state)
    _register_weights(app, state)


def _register_models(app: FastAPI, state: dict[str, TinkerService]) -> None:
    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict:
        svc, body = state["svc"], await read_json(request)
        cfg = body.get("lora_config") or {}
        if (body.get("optimizer_config") or {}).get("type", "adamw") != "adamw":
            raise EngineRequestError("only the adamw optimizer is available on this server")
        lora = LoraSpec(rank=int(cfg.get("rank", 32)), seed=cfg.get("seed"),
                        train_attn=bool(cfg.get("train_attn", True)), train_mlp=bool(cfg.get("train_mlp", True)),
                        train_unembed=bool(cfg.get("train_unembed", True)))
        record, request_id = svc.create_model(str(body.get("session_id")), int(body.get("model_seq_id", 0)),
                                              svc.base(body.get("base_model")), lora)
        return {"request_id": request_id, "model_id": record.model_id}

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict:
        record = state["svc"].model(str((await read_json(request)).get("model_id")))
        return {"type": "get_info", "model_id": record.model_id, "model_name": record.base.name,
                "is_lora": True, "lora_rank": record.lora.rank,
                "model_data": {"model_name": record.base.name, "tokenizer_id": record.base.tokenizer_path}}

    @app.post("/api/v1/unload_model")
    async def unload_model(request: Request) -> dict:
        svc = state["svc"]
        model_id = svc.model(str((await read_json(request)).get("model_id"))).model_id
        return {"request_id": svc.unload(model_id), "model_id": model_id}


def _register_steps(app: FastAPI, state: dict[str, TinkerService]) -> None:
    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict:
        svc = state["svc"]
        req = decode_request(await read_body(request))
        record = svc.model(req.model_id)
        try:
            check_datums(record, req.datums, svc.limits.max_datums, svc.limits.max_datum_tokens)
        except EngineRequestError:
            svc.pass_turn(req.model_id, req.seq_id)
            raise
        run = svc.engine.forward if req.forward_only else svc.engine.forward_backward

        def work() -> Payload:
            out = run(req.model_id, req.datums, req.loss_fn, req.loss_fn_config or None)
            return Payload(PROTO, encode_output(out))
        rid = svc.enqueue(req.model_id, work, model_seq=(req.model_id, req.seq_id))
        return {"request_id": rid, "model_id": req.model_id}

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict:
        svc, body = state["svc"], await read_json(request)
        record = svc.model(str(body.get("model_id")))
        params = body.get("adam_params") or body.get("optim_params") or {}
        if body.get("optimizer_params") is not None or params.get("type", "adam") not in ("adam", "adamw"):
            raise EngineRequestError("only AdamParams steps are available on this server")
        adam = AdamSpec(**{k: float(params[k]) for k in _ADAM_FIELDS if k in params})

        def work() -> Payload:
            return json_payload({"metrics": svc.engine.optim_step(record.model_id, adam)})
        return {"request_id": svc.enqueue(record.model_id, work, model_seq=_model_seq(body)),
                "model_id": record.model_id}


def _register_weights(app: FastAPI, state: dict[str, TinkerService]) -> None:
    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict:
        return _save(state["svc"], await read_json(request), for_sampler=False)

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict:
        return _save(state["svc"], await read_json(request), for_sampler=True)

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict:
        svc, body = state["svc"], await read_json(request)
        key = paths.key_of(str(body.get("path")))
        with_optimizer = bool(body.get("optimizer"))
        if body.get("session_id") is not None:  # a new model made from the checkpoint: its request 0
            record = _model_from_checkpoint(svc, body, key)
            model_seq = (record.model_id, 0)
        else:
            record = svc.model(str(body.get("model_id")))
            model_seq = _model_seq(body)

        def work() -> Payload:
            svc.engine.load_weights(record.model_id, key, with_optimizer=with_optimizer)
            return json_payload({"path": paths.path_for(key), "model_id": record.model_id,
                                 "type": "load_weights"})
        return {"request_id": svc.enqueue(record.model_id, work, model_seq=model_seq),
                "model_id": record.model_id}


def _model_from_checkpoint(svc: TinkerService, body: dict[str, Any], key: str) -> ModelRecord:
    """Create-via-load: the checkpoint's record gives the base and the adapter's shape."""
    found = svc.index.lookup(key)
    if found is None:
        raise EngineRequestError(f"{paths.path_for(key)}: no such checkpoint on this server", status=404)
    base_name, lora = found
    base_name = body.get("base_model") or base_name
    record, _ = svc.create_model(str(body["session_id"]), int(body.get("model_seq_id", 0)),
                                 svc.base(base_name), lora, first_seq=0)
    return record


def _save(svc: TinkerService, body: dict[str, Any], *, for_sampler: bool) -> dict:
    """save_state, or save_weights_for_sampler: unnamed, it also opens a sampling session."""
    record = svc.model(str(body.get("model_id")))
    named = body.get("path") is not None
    default = f"{'ephemeral' if for_sampler else 'step'}-{body.get('seq_id', 0)}"
    name = paths.check_name(str(body["path"]) if named else default)
    kind = "save_weights_for_sampler" if for_sampler else "save_weights"

    def work() -> Payload:
        key = svc.engine.save_weights(record.model_id, name, for_sampler=for_sampler)
        svc.index.record(key, record.base.name, record.lora)
        out: dict[str, Any] = {"path": paths.path_for(key), "type": kind}
        if for_sampler and not named:
            out["sampling_session_id"] = svc.new_sampler(record.base.name, key)
        return json_payload(out)
    return {"request_id": svc.enqueue(record.model_id, work, model_seq=_model_seq(body)),
            "model_id": record.model_id}
