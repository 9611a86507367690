"""Sampling routes: sampling sessions (on a base model or saved sampler weights) and asample."""

from __future__ import annotations

from fastapi import FastAPI, Request

from astrai_core.tinker import paths
from astrai_core.tinker.engine_types import EngineRequestError, SamplerTarget
from astrai_core.tinker.http_json import read_json
from astrai_core.tinker.futures import PROTO, Payload
from astrai_core.tinker.service import TinkerService
from astrai_core.tinker.wire_sample import ModelInputIn, encode_sample, model_input_tokens, sample_spec

CLONE_BLOCK = 1_000_000_000  # the SDK numbers a cloned sampling client's requests in its own block


def _sampler_for(svc: TinkerService, model_path: str | None, base_model: str | None) -> str:
    if model_path:
        key = paths.key_of(model_path)
        if paths.kind_of(key) != "sampler_weights":
            raise EngineRequestError(f"{model_path}: sample from weights saved with save_weights_for_sampler")
        found = svc.index.lookup(key)
        if found is None:
            raise EngineRequestError(f"{model_path}: no such checkpoint on this server", status=404)
        return svc.new_sampler(svc.base(base_model or found[0]).name, key)
    return svc.new_sampler(svc.base(base_model).name, None)


def _check_prompt(svc: TinkerService, base_name: str, prompt: list[int], num_samples: int) -> None:
    base = svc.bases[base_name]
    if not prompt or len(prompt) > base.max_context:
        raise EngineRequestError(f"prompt of {len(prompt)} tokens; 1 to {base.max_context} allowed")
    bad = [t for t in prompt if not 0 <= t < base.vocab_size]
    if bad:
        raise EngineRequestError(f"prompt token id {bad[0]} is out of range for {base.name} "
                                 f"(vocabulary of {base.vocab_size})")
    if not 1 <= num_samples <= svc.limits.max_samples:
        raise EngineRequestError(f"num_samples {num_samples}: 1 to {svc.limits.max_samples} allowed")


def register(app: FastAPI, state: dict[str, TinkerService]) -> None:
    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict:
        svc, body = state["svc"], await read_json(request)
        svc.session(str(body.get("session_id")))
        sampler_id = _sampler_for(svc, body.get("model_path"), body.get("base_model"))
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    @app.post("/api/v1/join_sampling_session")
    async def join_sampling_session(request: Request) -> dict:
        record = state["svc"].sampler(str((await read_json(request)).get("sampling_session_id")))
        record.clients += 1
        return {"type": "join_sampling_session", "client_counter": record.clients - 1}

    @app.get("/api/v1/samplers/{sampler_id}")
    async def get_sampler(sampler_id: str) -> dict:
        record = state["svc"].sampler(sampler_id)
        return {"sampler_id": record.sampler_id, "base_model": record.base_model,
                "model_path": paths.path_for(record.key) if record.key else None}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict:
        svc, body = state["svc"], await read_json(request)
        if body.get("sampling_session_id"):
            record = svc.sampler(str(body["sampling_session_id"]))
        else:  # a one-off request naming its model directly
            record = svc.sampler(_sampler_for(svc, body.get("model_path"), body.get("base_model")))
        prompt = model_input_tokens(ModelInputIn.model_validate(body.get("prompt") or {"chunks": []}), "prompt")
        num_samples = int(body.get("num_samples", 1))
        _check_prompt(svc, record.base_model, prompt, num_samples)
        for option in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(option):
                raise EngineRequestError(f"{option} is not supported by this server")
        spec = sample_spec(body.get("sampling_params") or {})
        target = SamplerTarget(record.base_model, record.key)
        want_prompt = bool(body.get("prompt_logprobs"))

        def work() -> Payload:
            out = svc.engine.sample(target, prompt, num_samples, spec, prompt_logprobs=want_prompt)
            return Payload(PROTO, encode_sample(out))
        seq = int(body.get("seq_id") or 0)
        rid = svc.enqueue(record.sampler_id, work, feed=(record.sampler_id, seq // CLONE_BLOCK))
        return {"request_id": rid, "sample_sequence_ids": [f"{rid}:{i}" for i in range(num_samples)]}
