"""The SDK's sample request (JSON) and result (protobuf), to and from the engine's types."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

from astrai_core.tinker import protowire as pw
from astrai_core.tinker.engine_types import EngineRequestError, SampleOut, SampleSpec

_STOP_REASON = {"stop": 0, "length": 1}


class ChunkIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "encoded_text"
    tokens: list[int] | None = None


class ModelInputIn(BaseModel):
    chunks: list[ChunkIn]


def model_input_tokens(model_input: ModelInputIn, what: str) -> list[int]:
    """The tokens of a JSON ``ModelInput``; any chunk but encoded text is refused."""
    tokens: list[int] = []
    for chunk in model_input.chunks:
        if chunk.type != "encoded_text" or chunk.tokens is None:
            raise EngineRequestError(f"{what}: {chunk.type} chunks are not supported; "
                                     "this server takes token (encoded_text) chunks only")
        tokens.extend(chunk.tokens)
    return tokens


def sample_spec(params: dict[str, Any]) -> SampleSpec:
    """The SDK's ``SamplingParams`` (``stop``: a string, strings or token ids)."""
    stop = params.get("stop")
    strings: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        strings = tuple(stop)
    elif isinstance(stop, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        token_ids = tuple(stop)
    elif stop is not None:
        raise EngineRequestError("sampling_params.stop: give a string, a list of strings or a list of token ids")
    return SampleSpec(max_tokens=params.get("max_tokens"), temperature=float(params.get("temperature", 1.0)),
                      top_p=float(params.get("top_p", 1.0)), top_k=int(params.get("top_k", -1)),
                      seed=params.get("seed"), stop_tokens=token_ids, stop_strings=strings)


def encode_sample(out: SampleOut) -> bytes:
    """``SampleOut`` as the SDK's ``SampleResponse`` proto (NaN where a prompt logprob is None)."""
    body = b""
    for seq in out.sequences:
        body += pw.enc_bytes(1, pw.enc_varint(1, _STOP_REASON[seq.stop_reason])
                             + pw.enc_bytes(2, np.asarray(seq.tokens, dtype=np.int32).tobytes())
                             + pw.enc_bytes(3, np.asarray(seq.logprobs, dtype=np.float32).tobytes()))
    if out.prompt_logprobs is not None:
        values = [np.nan if v is None else v for v in out.prompt_logprobs]
        body += pw.enc_bytes(2, np.asarray(values, dtype=np.float32).tobytes())
    return body
