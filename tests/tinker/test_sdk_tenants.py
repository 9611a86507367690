"""Several tenants on one server: isolation, and round-robin service of their queues."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
from tinker import types  # noqa: E402

from tests.tinker.conftest import live_tinker  # noqa: E402
from tests.tinker.fake_engine import BASE, FakeEngine  # noqa: E402
from tests.tinker.test_sdk_training import ROWS  # noqa: E402


def _train(server, lr: float, steps: int) -> list[np.ndarray]:
    trainer = server.client().create_lora_training_client(base_model=BASE, rank=2).result()
    outs = []
    for _ in range(steps):
        fb = trainer.forward_backward(ROWS, "cross_entropy")
        trainer.optim_step(types.AdamParams(learning_rate=lr)).result()
        outs.append(np.concatenate([o["logprobs"].to_numpy() for o in fb.result().loss_fn_outputs]))
    return outs


def test_two_tenants_concurrently_are_unaffected_bit_for_bit(tokenizer_dir, tmp_path):
    with live_tinker(FakeEngine(tokenizer_dir, tmp_path / "alone")) as alone:
        want_a, want_b = _train(alone, 0.05, 5), _train(alone, 0.2, 5)
    with live_tinker(FakeEngine(tokenizer_dir, tmp_path / "shared")) as shared:
        got: dict[str, list[np.ndarray]] = {}
        threads = [threading.Thread(target=lambda k=k, lr=lr: got.__setitem__(k, _train(shared, lr, 5)))
                   for k, lr in (("a", 0.05), ("b", 0.2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    for want, have in ((want_a, got["a"]), (want_b, got["b"])):
        for w, h in zip(want, have, strict=True):
            np.testing.assert_array_equal(w, h)


def test_a_small_request_finishes_while_a_large_backlog_runs(server, fake):
    service = server.client()
    big = service.create_lora_training_client(base_model=BASE, rank=2).result()
    small = service.create_lora_training_client(base_model=BASE, rank=2).result()
    fake.delay[big.model_id] = 0.15
    backlog = [big.forward(ROWS, "cross_entropy") for _ in range(8)]
    time.sleep(0.3)  # the backlog is queued and running
    started = time.monotonic()
    small.forward(ROWS, "cross_entropy").result()
    waited = time.monotonic() - started
    assert not backlog[-1].future().done()  # the large job is still running
    for f in backlog:
        f.result()
    order = [m for _, m in fake.log]
    assert order.index(small.model_id) < len(order) - 3  # served between the big tenant's jobs
    assert waited < 8 * 0.15
