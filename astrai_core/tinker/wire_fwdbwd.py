"""The SDK's binary forward_backward request and result, to and from the engine's types."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from astrai_core.tinker import protowire as pw
from astrai_core.tinker.engine_types import DatumIn, EngineRequestError, ForwardOut

# The proto's DType enum: float32, int64, int32, bfloat16.
_DTYPES = {1: np.float32, 2: np.int64, 3: np.int32, 4: np.uint16}
_DTYPE_FLOAT32, _DTYPE_INT64 = 1, 2


@dataclass
class FwdBwdRequest:
    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float]
    forward_only: bool
    datums: list[DatumIn]


def _tensor(buf: bytes) -> np.ndarray:
    dense, csr, dtype, shape = None, None, 0, []
    for num, wire, value in pw.iter_fields(buf):
        if num == 1:
            dense = bytes(value)
        elif num == 2:
            csr = {n: bytes(v) for n, _, v in pw.iter_fields(bytes(value))}
        elif num == 3:
            dtype = int(value)
        elif num == 4:
            shape.extend(pw.packed_ints(wire, value))
    if dtype not in _DTYPES:
        raise EngineRequestError(f"loss_fn_inputs: unsupported tensor dtype {dtype}")
    np_dtype = _DTYPES[dtype]
    if csr is not None:
        return _densify(csr, np_dtype, shape)
    arr = np.frombuffer(dense or b"", dtype=np_dtype)
    if shape:
        if int(np.prod(shape)) != arr.size:
            raise EngineRequestError(f"loss_fn_inputs: {arr.size} values do not fill shape {shape}")
        arr = arr.reshape(shape)
    return _widen(arr)


def _widen(arr: np.ndarray) -> np.ndarray:
    if arr.dtype == np.uint16:  # bfloat16: the upper half of a float32
        return (arr.astype(np.uint32) << 16).view(np.float32)
    return arr.astype(np.int64 if arr.dtype.kind == "i" else np.float32)


def _densify(csr: dict[int, bytes], np_dtype, shape: list[int]) -> np.ndarray:
    if len(shape) != 2:
        raise EngineRequestError("loss_fn_inputs: a sparse tensor needs a 2-D shape")
    values = _widen(np.frombuffer(csr.get(1, b""), dtype=np_dtype))
    crow = np.frombuffer(csr.get(2, b""), dtype=np.int64)
    col = np.frombuffer(csr.get(3, b""), dtype=np.int64)
    ok = (len(crow) == shape[0] + 1 and crow[0] == 0 and crow[-1] == len(col) == len(values)
          and np.all(np.diff(crow) >= 0) and np.all((col >= 0) & (col < shape[1])))
    if not ok:
        raise EngineRequestError("loss_fn_inputs: malformed sparse tensor indices")
    out = np.zeros(shape, dtype=values.dtype)
    rows = np.repeat(np.arange(shape[0]), np.diff(crow))
    out[rows, col] = values
    return out


def _chunk_tokens(buf: bytes, index: int) -> list[int]:
    for num, _, value in pw.iter_fields(buf):
        if num == 1:
            for n, _, tokens in pw.iter_fields(bytes(value)):
                if n == 1:
                    return np.frombuffer(bytes(tokens), dtype=np.int32).astype(np.int64).tolist()
            return []
        if num in (2, 3):
            kind = "image" if num == 2 else "audio"
            raise EngineRequestError(f"datum {index}: {kind} chunks are not supported; "
                                     "this server takes token (encoded_text) chunks only")
    return []


def _datum(buf: bytes, index: int) -> DatumIn:
    tokens: list[int] = []
    inputs: dict[str, np.ndarray] = {}
    for num, _, value in pw.iter_fields(buf):
        if num == 1:
            tokens.extend(_chunk_tokens(bytes(value), index))
        elif num == 2:
            entry = {n: v for n, _, v in pw.iter_fields(bytes(value))}
            inputs[bytes(entry.get(1, b"")).decode()] = _tensor(bytes(entry.get(2, b"")))
    return DatumIn(tokens=tokens, loss_fn_inputs=inputs)


def _config_value(buf: bytes) -> tuple[str, float | str]:
    entry = {n: (w, v) for n, w, v in pw.iter_fields(buf)}
    key = bytes(entry.get(1, (0, b""))[1]).decode()
    wire, value = entry.get(2, (pw.LEN, b""))
    if wire == pw.FIXED64:
        return key, pw.as_double(wire, value)
    inner = {n: (w, v) for n, w, v in pw.iter_fields(bytes(value))}
    if 1 in inner:
        return key, pw.as_double(*inner[1])
    return key, bytes(inner.get(2, (0, b""))[1]).decode()


def decode_request(body: bytes) -> FwdBwdRequest:
    """The request the SDK's ``forward_backward_request_to_proto`` wrote."""
    req = FwdBwdRequest("", 0, "", {}, False, [])
    config_v1: dict[str, float | str] = {}
    config_v2: dict[str, float | str] = {}
    for num, wire, value in pw.iter_fields(body):
        if num == 1:
            req.model_id = bytes(value).decode()
        elif num == 2:
            req.seq_id = pw.signed64(int(value))
        elif num == 3:
            req.datums.append(_datum(bytes(value), len(req.datums)))
        elif num == 4:
            req.loss_fn = bytes(value).decode()
        elif num in (5, 7):
            key, val = _config_value(bytes(value))
            (config_v1 if num == 5 else config_v2)[key] = val
        elif num == 6:
            req.forward_only = bool(value)
    config = config_v2 or config_v1  # the SDK writes both; the newer one carries strings too
    strings = sorted(k for k, v in config.items() if isinstance(v, str))
    if strings:
        raise EngineRequestError(f"loss_fn_config: text values are not supported ({', '.join(strings)})")
    req.loss_fn_config = {k: float(v) for k, v in config.items()}
    return req


def _batched(arr: np.ndarray) -> bytes:
    is_float = arr.dtype.kind == "f"
    data = np.ascontiguousarray(arr, dtype=np.float32 if is_float else np.int64)
    offsets = np.array([0, data.nbytes], dtype=np.int64)
    return (pw.enc_bytes(1, data.tobytes()) + pw.enc_bytes(2, offsets.tobytes())
            + pw.enc_varint(3, _DTYPE_FLOAT32 if is_float else _DTYPE_INT64)
            + pw.enc_packed(4, list(data.shape[1:])))


def encode_output(out: ForwardOut) -> bytes:
    """``ForwardOut`` as the SDK's ``ForwardBackwardOutput`` proto, one record per datum
    (per-datum arrays may differ in length and trailing shape)."""
    body = pw.enc_string(1, "ArrayRecord")
    for fields in out.outputs:
        record = pw.enc_string(1, "ArrayRecord") + pw.enc_varint(3, 1)
        for name, arr in fields.items():
            arr = np.asarray(arr)
            if arr.ndim == 0:
                arr = arr.reshape(1)
            record += pw.enc_bytes(2, pw.enc_string(1, name) + pw.enc_bytes(2, _batched(arr)))
        body += pw.enc_bytes(2, record)
    for key, value in out.metrics.items():
        body += pw.enc_bytes(3, pw.enc_string(1, key) + pw.enc_double(2, value))
    return body
