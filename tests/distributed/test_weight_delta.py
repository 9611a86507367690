"""Delta weight pushes (``astrai_core.distributed.weight_delta``): a receiver fed only the
changed elements holds the trainer's weights bit for bit, fewer bytes travel than in a
full push, and corruption or a missed push is caught by the digests; a ``DeltaMirror``
(a receiver that reloads whole states) follows the pushes and drops its copy on a failure."""

from __future__ import annotations

import copy
import hashlib
import json

import pytest
import torch

from astrai_core.api import (CausalLM, DeltaEncoder, DeltaManifest, DeltaMirror, ModelConfig,
                             WeightPushMismatch, apply_delta, iter_push_buckets, state_digest)
from astrai_core.testing import TINY_MODEL

BUCKET = 4096  # bytes: several buckets for the tiny model


def _bf16_model() -> CausalLM:
    torch.manual_seed(0)
    return CausalLM(ModelConfig(vocab_size=64, **TINY_MODEL)).to(torch.bfloat16)


def _train_step(model: CausalLM, optimizer: torch.optim.Optimizer, step: int) -> None:
    generator = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 64, (2, 12), generator=generator)
    logits = model(ids)["logits"]
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 64).float(),
                                             ids[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(torch.int16)


def _push(encoder: DeltaEncoder, model: CausalLM, receiver: dict[str, torch.Tensor],
          transit=lambda payload: payload) -> tuple[int, int, set[str]]:
    """One delta push into ``receiver``; (bytes sent, bytes of a full push, modes used)."""
    sent = full = 0
    modes: set[str] = set()
    encoder.start_push()
    for group in iter_push_buckets(model, BUCKET):
        full += sum(t.numel() * t.element_size() for t in group.values())
        payload, manifest = encoder.encode(group)
        payload = transit({k: v.clone() for k, v in payload.items()})  # a copy, as on a wire
        sent += sum(t.numel() * t.element_size() for t in payload.values())
        modes |= {record.mode for record in manifest.records}
        apply_delta(receiver, payload, manifest)
    return sent, full, modes


def _trained_pair(steps: int):
    model = _bf16_model()
    receiver_model = copy.deepcopy(model)
    receiver = dict(receiver_model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    encoder = DeltaEncoder()
    history = []
    for step in range(steps):
        _train_step(model, optimizer, step)
        history.append(_push(encoder, model, receiver))
        for name, value in model.state_dict().items():  # bit for bit after every push
            assert torch.equal(_bits(receiver[name]), _bits(value)), (step, name)
    return model, receiver, encoder, history


def test_delta_pushes_keep_the_receiver_bit_exact_and_send_fewer_bytes():
    model, receiver, _, history = _trained_pair(steps=4)
    first_sent, first_full, first_modes = history[0]
    assert first_sent == first_full and first_modes == {"dense"}  # nothing to compare against
    for sent, full, modes in history[1:]:
        assert 0 < sent < full / 2
        assert "sparse" in modes
    # some values changed, many did not: the test exercises the sparse path for real
    initial = _bf16_model().state_dict()
    changed = sum(int((_bits(initial[k]) != _bits(v)).sum()) for k, v in model.state_dict().items())
    total = sum(v.numel() for v in initial.values())
    assert 0 < changed < total / 2


def test_unchanged_tensors_stay_home():
    model = _bf16_model()
    receiver = dict(copy.deepcopy(model).state_dict())
    encoder = DeltaEncoder()
    _push(encoder, model, receiver)
    sent, _, modes = _push(encoder, model, receiver)  # no step in between
    assert sent == 0 and modes == set()


def test_a_byte_flipped_in_transit_names_the_bucket_and_tensor():
    model = _bf16_model()
    receiver = dict(copy.deepcopy(model).state_dict())
    encoder = DeltaEncoder()
    _push(encoder, model, receiver)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _train_step(model, optimizer, 0)

    def flip(payload):
        for name, tensor in payload.items():
            if name.endswith("#values"):
                tensor.view(torch.uint8)[0] ^= 0x10
                return payload
        return payload

    with pytest.raises(WeightPushMismatch, match=r"bucket \d+, tensor '[^']+' does not match"):
        _push(encoder, model, receiver, transit=flip)


def test_a_receiver_that_missed_a_push_is_caught():
    model = _bf16_model()
    stale = dict(copy.deepcopy(model).state_dict())
    encoder = DeltaEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    _train_step(model, optimizer, 0)
    _push(encoder, model, dict(copy.deepcopy(model).state_dict()))  # another receiver's
    _train_step(model, optimizer, 1)
    with pytest.raises(WeightPushMismatch, match="missed a push"):
        _push(encoder, model, stale)


def test_whole_state_digest_matches_then_catches_a_corrupted_value():
    model, receiver, _, _ = _trained_pair(steps=2)
    trainer = state_digest(iter_push_buckets(model, BUCKET))
    assert state_digest(receiver) == trainer
    name = "layers.0.mlp.up_proj.weight"
    expected = hashlib.blake2b(receiver[name].reshape(-1).view(torch.uint8).numpy().tobytes(),
                               digest_size=16).hexdigest()
    assert trainer[name] == expected  # the digest is BLAKE2b of the raw bytes
    receiver[name].view(-1)[3] = receiver[name].view(-1)[3] * 2 + 1
    wrong = state_digest(receiver)
    assert [k for k in trainer if wrong[k] != trainer[k]] == [name]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.uint8])
def test_any_dtype_round_trips(dtype):
    encoder = DeltaEncoder()
    old = (torch.arange(4000) % 251).to(dtype).reshape(40, 100)
    receiver = {"w": old.clone()}
    payload, manifest = encoder.encode({"w": old})
    apply_delta(receiver, payload, manifest)
    new = old.clone()
    new.view(-1)[[5, 999, 3999]] = torch.tensor([7, 9, 11]).to(dtype)
    payload, manifest = encoder.encode({"w": new})
    assert [r.mode for r in manifest.records] == ["sparse"]
    apply_delta(receiver, payload, manifest)
    assert torch.equal(receiver["w"], new)


def _mirror_push(encoder: DeltaEncoder, model: CausalLM, mirror: DeltaMirror, fresh: bool,
                 transit=lambda payload: payload) -> int:
    """One push into ``mirror``, each manifest through JSON as it would cross processes;
    the bytes sent."""
    sent = 0
    encoder.start_push()
    for group in iter_push_buckets(model, BUCKET):
        payload, manifest = encoder.encode(group)
        if not manifest.records:
            continue
        payload = transit({k: v.clone() for k, v in payload.items()})
        sent += sum(t.numel() * t.element_size() for t in payload.values())
        plain = json.loads(json.dumps(manifest.to_plain()))
        assert DeltaManifest.from_plain(plain) == manifest
        mirror.apply(payload, DeltaManifest.from_plain(plain), fresh)
    return sent


def test_a_mirror_follows_whole_then_delta_pushes_bit_for_bit():
    model = _bf16_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    encoder, mirror = DeltaEncoder(), DeltaMirror("the engine")
    full = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for step in range(3):
        _train_step(model, optimizer, step)
        sent = _mirror_push(encoder, model, mirror, fresh=step == 0)
        assert sent == full if step == 0 else 0 < sent < full / 2
        assert sorted(mirror.tensors) == sorted(model.state_dict())
        for name, value in model.state_dict().items():
            assert torch.equal(_bits(mirror.tensors[name]), _bits(value)), (step, name)
            assert mirror.tensors[name].data_ptr() != value.data_ptr()  # a copy, not the policy
        assert mirror.digests(model.state_dict()) == state_digest(model.state_dict())


def test_a_mirror_drops_its_copy_on_a_mismatch_and_takes_only_a_whole_push_next():
    model = _bf16_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    encoder, mirror = DeltaEncoder(), DeltaMirror("the engine")
    _mirror_push(encoder, model, mirror, fresh=True)
    _train_step(model, optimizer, 0)

    def flip(payload):
        name = next(n for n in payload if n.endswith("#values"))
        payload[name].view(torch.uint8)[0] ^= 0x10
        return payload

    with pytest.raises(WeightPushMismatch, match=r"^the engine: weight push bucket \d+, tensor '"):
        _mirror_push(encoder, model, mirror, fresh=False, transit=flip)
    assert mirror.tensors == {} and mirror.digests(["embed_tokens.weight"]) == {}
    encoder.reset()
    _train_step(model, optimizer, 1)
    with pytest.raises(WeightPushMismatch, match="holds no copy of the last push"):
        _mirror_push(DeltaEncoder(), model, DeltaMirror("the engine"), fresh=False)
    _mirror_push(encoder, model, mirror, fresh=True)  # a whole push starts a new copy
    assert mirror.digests(model.state_dict()) == state_digest(model.state_dict())
