"""An engine call as bytes, to hand it from the serving process to the others.

A message is an 8-byte little-endian length, a JSON header (the method, its plain
arguments, and each array's dtype and shape), then the arrays' raw bytes. Nothing in it is
unpickled or executed: the method must be one of :data:`CALLS`, the specs are rebuilt
field by field, and an array's dtype must be numeric.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict
from typing import Any

import numpy as np

from astrai_core.tinker.engine_types import (AdamSpec, DatumIn, LoraSpec, SamplerTarget,
                                             SampleSpec)

# the Engine methods that change or read what every process holds, and ``stop``
CALLS = ("create_model", "unload_model", "forward", "forward_backward", "optim_step",
         "save_weights", "load_weights", "sample", "stop")
SPECS = {"lora": LoraSpec, "adam": AdamSpec, "spec": SampleSpec, "target": SamplerTarget}
NUMERIC_KINDS = "biuf"
_LENGTH = struct.Struct("<Q")


class CallWireError(ValueError):
    """A message that is not an engine call this module wrote."""


def encode_call(method: str, kwargs: dict[str, Any]) -> bytes:
    """``method(**kwargs)`` as one message; ``datums`` and the specs are encoded by name."""
    if method not in CALLS:
        raise CallWireError(f"unknown engine call {method!r}")
    arrays: list[np.ndarray] = []
    args = {}
    for name, value in kwargs.items():
        if name == "datums":
            value = [_datum_header(datum, arrays) for datum in value]
        elif name in SPECS:
            value = asdict(value)
        args[name] = value
    header = {"method": method, "args": args,
              "arrays": [[array.dtype.str, list(array.shape)] for array in arrays]}
    text = json.dumps(header).encode()
    return b"".join([_LENGTH.pack(len(text)), text, *(array.tobytes() for array in arrays)])


def decode_call(message: bytes) -> tuple[str, dict[str, Any]]:
    """(method, kwargs) of a message :func:`encode_call` wrote."""
    if len(message) < _LENGTH.size:
        raise CallWireError("a message shorter than its header")
    (size,) = _LENGTH.unpack_from(message)
    try:
        header = json.loads(message[_LENGTH.size:_LENGTH.size + size])
        method, args, specs = header["method"], header["args"], header["arrays"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CallWireError(f"a message that is not an engine call ({exc})") from None
    if method not in CALLS:
        raise CallWireError(f"unknown engine call {method!r}")
    arrays = _read_arrays(message, _LENGTH.size + size, specs)
    kwargs = {}
    for name, value in args.items():
        if name == "datums":
            value = [DatumIn([int(t) for t in d["tokens"]],
                             {key: arrays[index] for key, index in d["inputs"].items()})
                     for d in value]
        elif name in SPECS:
            value = SPECS[name](**{k: tuple(v) if isinstance(v, list) else v
                                   for k, v in value.items()})
        kwargs[name] = value
    return method, kwargs


def _datum_header(datum: DatumIn, arrays: list[np.ndarray]) -> dict[str, Any]:
    inputs = {}
    for key, value in datum.loss_fn_inputs.items():
        inputs[key] = len(arrays)
        arrays.append(np.ascontiguousarray(value))
    return {"tokens": [int(t) for t in datum.tokens], "inputs": inputs}


def _read_arrays(message: bytes, offset: int, specs: list[list[Any]]) -> list[np.ndarray]:
    arrays = []
    for dtype_name, shape in specs:
        dtype = np.dtype(dtype_name)
        if dtype.kind not in NUMERIC_KINDS:
            raise CallWireError(f"array dtype {dtype_name!r} is not numeric")
        count = int(np.prod(shape, dtype=np.int64))
        end = offset + count * dtype.itemsize
        if end > len(message):
            raise CallWireError("a message shorter than its arrays")
        arrays.append(np.frombuffer(message[offset:end], dtype=dtype).reshape(shape).copy())
        offset = end
    return arrays
