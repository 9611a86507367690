"""``forward_backward_custom`` through the official SDK on the real torch engine: the step
it takes equals the same step taken locally with autograd on the same adapter.

The reference scores the targets from the model's full logits (``log_softmax``), not the
chunked head the server uses, differentiates the loss itself and steps the tenant's own
AdamW: it shares no code with the SDK's forward-then-``cross_entropy`` path."""

from __future__ import annotations

import numpy as np
import pytest

tinker = pytest.importorskip("tinker")
pytest.importorskip("fastapi")
import torch  # noqa: E402
from tinker import types  # noqa: E402

from astrai_core.tinker.engine_types import AdamSpec, LoraSpec  # noqa: E402
from tests.tinker.conftest import BASE, live_tinker, sft_datums  # noqa: E402

LR = 1e-2


def _token_weights(length: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(0.2, 2.0, length).astype(np.float32)


def _sdk_rows() -> list[types.Datum]:
    """Rows whose per-token weights travel in a key the server never sees."""
    datums, _, _ = sft_datums(0)
    return [types.Datum(model_input=types.ModelInput.from_ints(d.tokens),
                        loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"].tolist(),
                                        "token_weights": types.TensorData.from_numpy(
                                            _token_weights(len(d.tokens), i))})
            for i, d in enumerate(datums)]


def weighted_nll(logprobs: torch.Tensor, token_weights: torch.Tensor) -> torch.Tensor:
    """A weighted NLL with a quadratic term, so its gradient depends on the log-probs."""
    return -(token_weights * logprobs).sum() + 0.1 * (logprobs**2).sum()


def _local_step(engine, model_id: str) -> float:
    """The custom loss's step by autograd on full logits; returns the loss."""
    tenant = engine.tenants[model_id]
    model = tenant.base.model
    datums, _, _ = sft_datums(0)
    tenant.base.slots.activate(tenant.slot)
    try:
        total = torch.zeros(())
        for i, datum in enumerate(datums):
            logits = model(torch.tensor([datum.tokens]))["logits"][0].float()
            targets = torch.as_tensor(datum.loss_fn_inputs["target_tokens"])
            logprobs = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
            total = total + weighted_nll(logprobs, torch.as_tensor(_token_weights(len(datum.tokens), i)))
        total.backward()
    finally:
        tenant.base.slots.activate(None)
    tenant.step(AdamSpec(learning_rate=LR))
    return float(total.detach())


def _local_logprobs(engine, model_id: str) -> np.ndarray:
    datums, _, _ = sft_datums(0)
    out = engine.forward(model_id, datums, "cross_entropy")
    return np.concatenate([o["logprobs"] for o in out.outputs])


def _sdk_logprobs(trainer) -> np.ndarray:
    datums, _, _ = sft_datums(0)
    rows = [types.Datum(model_input=types.ModelInput.from_ints(d.tokens),
                        loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"].tolist(),
                                        "weights": d.loss_fn_inputs["weights"].tolist()}) for d in datums]
    out = trainer.forward(rows, "cross_entropy").result()
    return np.concatenate([o["logprobs"].to_numpy() for o in out.loss_fn_outputs])


def _per_batch(data, logprobs_list):
    """The SDK's callable form: the whole batch at once."""
    loss = sum(weighted_nll(lp, d.loss_fn_inputs["token_weights"].to_torch())
               for d, lp in zip(data, logprobs_list, strict=True))
    return loss, {"custom_nll": float(loss.detach())}


@pytest.mark.parametrize("form", ["callable", "loss_handle"])
def test_a_custom_loss_step_equals_the_same_step_by_local_autograd(make_engine, tmp_path, form):
    direct = make_engine(tmp_path / "direct")
    direct.create_model("direct:train:0", BASE, LoraSpec(rank=4, seed=7))
    with live_tinker(make_engine(tmp_path / "served")) as server:
        service = server.client()
        trainer = service.create_lora_training_client(base_model=BASE, rank=4, seed=7).result()
        if form == "callable":
            loss_fn = _per_batch
        else:
            def custom_nll(logprobs, token_weights):
                loss = weighted_nll(logprobs, token_weights)
                return loss, {"custom/nll:sum": loss}
            loss_fn = service.create_custom_loss(
                custom_nll, input_ranks={"logprobs": 1, "token_weights": 1}).result()
            assert loss_fn.loss_id is None  # this server runs custom losses on the client
        for _ in range(2):
            got = trainer.forward_backward_custom(_sdk_rows(), loss_fn)
            trainer.optim_step(types.AdamParams(learning_rate=LR)).result()
            want = _local_step(direct, "direct:train:0")
            metrics = got.result().metrics
            assert metrics["loss:sum"] == pytest.approx(want, rel=1e-5, abs=1e-5)
            np.testing.assert_allclose(_sdk_logprobs(trainer), _local_logprobs(direct, "direct:train:0"),
                                       atol=1e-5)
