"""Rank 0's side of a multi-process server without processes: each engine call goes out as
bytes that decode to the same call (no pickle), and the ranks' verdict decides what the
client gets: rank 0's own refusal, another rank's failure, or a stop when they lost each other."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from astrai_core.tinker.call_wire import CallWireError, decode_call, encode_call
from astrai_core.tinker.engine_types import (AdamSpec, DatumIn, EngineRequestError, ForwardOut,
                                             LoraSpec, SamplerTarget, SampleSpec)
from astrai_core.tinker.lockstep import STOP, LockstepEngine


def test_a_call_round_trips_bit_for_bit():
    datums = [DatumIn([1, 2, 3], {"target_tokens": np.array([2, 3, 4], dtype=np.int64),
                                  "weights": np.array([0.1, np.nan, -np.inf], dtype=np.float32)}),
              DatumIn([7], {"advantages": np.array([[1e-38]], dtype=np.float64)})]
    method, kwargs = decode_call(encode_call("forward_backward", {
        "model_id": "s:train:0", "datums": datums, "loss_fn": "ppo",
        "loss_fn_config": {"clip_low_threshold": 0.8}}))
    assert method == "forward_backward" and kwargs["model_id"] == "s:train:0"
    assert kwargs["loss_fn_config"] == {"clip_low_threshold": 0.8}
    for got, want in zip(kwargs["datums"], datums, strict=True):
        assert got.tokens == want.tokens and got.loss_fn_inputs.keys() == want.loss_fn_inputs.keys()
        for key, array in want.loss_fn_inputs.items():
            assert got.loss_fn_inputs[key].dtype == array.dtype
            assert got.loss_fn_inputs[key].tobytes() == array.tobytes()
    specs = {"target": SamplerTarget("b", "m/sampler_weights/x"), "prompt": [4, 5], "num_samples": 2,
             "spec": SampleSpec(max_tokens=3, seed=7, stop_tokens=(9,), stop_strings=("ab",)),
             "prompt_logprobs": True}
    assert decode_call(encode_call("sample", specs)) == ("sample", specs)
    for name, spec in (("lora", LoraSpec(rank=4, seed=None, train_mlp=False)),
                       ("adam", AdamSpec(learning_rate=0.5, grad_clip_norm=1.0))):
        assert decode_call(encode_call("create_model", {name: spec}))[1][name] == spec


def test_anything_but_a_known_call_with_numeric_arrays_is_refused():
    with pytest.raises(CallWireError, match="unknown engine call 'eval'"):
        encode_call("eval", {})
    message = encode_call("forward", {"datums": [DatumIn([1], {"w": np.zeros(1, np.float32)})]})
    with pytest.raises(CallWireError, match="unknown engine call '__init__'"):
        decode_call(_edited(message, b'"forward"', b'"__init__"'))
    with pytest.raises(CallWireError, match="not numeric"):
        decode_call(_edited(message, b'"<f4"', b'"|O8"'))
    with pytest.raises(CallWireError, match="shorter than its arrays"):
        decode_call(message[:-1])
    with pytest.raises(CallWireError, match="not an engine call"):
        decode_call(_edited(message, b'"args"', b'"args'))


def _edited(message: bytes, old: bytes, new: bytes) -> bytes:
    """``message`` with ``old`` replaced in its header, and the header's length fixed."""
    size = struct.unpack_from("<Q", message)[0]
    header = message[8:8 + size].replace(old, new)
    return struct.pack("<Q", len(header)) + header + message[8 + size:]


class FakeChannel:
    """Records what rank 0 sends; the other ranks' verdict and a broken link are set by hand."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []
        self.others_failed: list[int] = []
        self.broken = False

    def send(self, message: bytes) -> None:
        if self.broken:
            raise RuntimeError("Connection closed by peer")
        self.sent.append(decode_call(message))

    def failed_ranks(self, failed: bool) -> list[int]:
        return ([0] if failed else []) + self.others_failed


class FakeEngine:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def forward(self, model_id, datums, loss_fn, loss_fn_config=None) -> ForwardOut:
        self.calls.append(model_id)
        if model_id == "missing":
            raise EngineRequestError("unknown model_id 'missing'", status=404)
        return ForwardOut([], {"loss:sum": 1.5})


def _forward(engine: LockstepEngine, model_id: str = "m") -> ForwardOut:
    return engine.forward(model_id, [DatumIn([1], {})], "cross_entropy")


def test_each_call_reaches_the_other_ranks_before_rank_0_runs_it():
    channel, inner = FakeChannel(), FakeEngine()
    engine = LockstepEngine(inner, channel)
    assert _forward(engine).metrics == {"loss:sum": 1.5}
    assert [m for m, _ in channel.sent] == ["forward"] and inner.calls == ["m"]
    with pytest.raises(EngineRequestError, match="unknown model_id 'missing'") as refused:
        _forward(engine, "missing")  # refused everywhere alike: rank 0's own error, its status
    assert refused.value.status == 404
    channel.others_failed = [1]
    with pytest.raises(RuntimeError, match="forward failed on process 1 of the server"):
        _forward(engine)
    channel.others_failed = []
    assert _forward(engine).metrics == {"loss:sum": 1.5}  # and the server goes on
    engine.stop()
    assert channel.sent[-1] == (STOP, {})
    with pytest.raises(RuntimeError, match="stopping"):
        _forward(engine)


def test_ranks_that_lost_each_other_stop_the_server():
    channel = FakeChannel()
    engine = LockstepEngine(FakeEngine(), channel)
    stopped = []
    engine.on_broken = lambda: stopped.append(True)
    channel.broken = True
    with pytest.raises(RuntimeError, match="lost each other during forward"):
        _forward(engine)
    assert stopped == [True] and "Connection closed by peer" in engine.broken
    with pytest.raises(RuntimeError, match="the server is stopping"):
        _forward(engine)
    engine.stop()  # nothing more is sent to ranks that are gone
    assert channel.sent == []


@pytest.mark.parametrize(("count", "world", "shares"), [
    (3, 2, [(0, 2), (2, 3)]), (1, 2, [(0, 1), (1, 1)]), (7, 3, [(0, 3), (3, 5), (5, 7)]),
    (4, 1, [(0, 4)])])
def test_each_rank_takes_a_contiguous_share_of_the_datums(count, world, shares):
    from astrai_core.distributed.context import DistContext
    from astrai_core.tinker.rank_rows import rank_rows

    got = [rank_rows(count, DistContext(rank=r, world_size=world)) for r in range(world)]
    assert [(s.start, s.stop) for s in got] == shares
