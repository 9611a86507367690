"""A small stand-in for the Tinker engine: each adapter is one number ``w``.

Per input token, ``logprob = -w**2 - 0.001 * target``; cross_entropy's loss is
``sum(-logprob * weight)``, so Adam steps on ``w`` make it fall. It records what it
returned, so tests can compare what the SDK read with what the engine produced.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np

from astrai_core.tinker.engine_types import (AdamSpec, BaseModelFacts, DatumIn, EngineRequestError, ForwardOut,
                                             LoraSpec, SampledOut, SampleOut, SampleSpec, SamplerTarget)

BASE = "tiny/base"
VOCAB = 64


class FakeEngine:
    def __init__(self, tokenizer_dir: Path, state_dir: Path) -> None:
        self.facts = BaseModelFacts(BASE, str(tokenizer_dir), VOCAB, 128, 8)
        self.state_dir = state_dir
        self.w: dict[str, float] = {}
        self.grad: dict[str, float] = {}
        self.delay: dict[str, float] = {}  # seconds each call on a model (or sampler weights) takes
        self.returned: list[tuple[str, object]] = []
        self.log: list[tuple[str, str]] = []  # (call, model_id), in the order the engine ran them
        self.lock = threading.Lock()

    def base_models(self) -> list[BaseModelFacts]:
        return [self.facts]

    def create_model(self, model_id: str, base_model: str, lora: LoraSpec) -> None:
        self.w[model_id], self.grad[model_id] = 1.0 + 0.01 * (lora.seed or 0), 0.0

    def unload_model(self, model_id: str) -> None:
        self.w.pop(model_id, None)

    def model_base(self, model_id: str) -> BaseModelFacts:
        return self.facts

    def _logprobs(self, w: float, targets: np.ndarray) -> np.ndarray:
        return (-(w ** 2) - 0.001 * targets).astype(np.float32)

    def forward(self, model_id, datums, loss_fn, loss_fn_config=None) -> ForwardOut:
        return self._run(model_id, datums, loss_fn, backward=False)

    def forward_backward(self, model_id, datums, loss_fn, loss_fn_config=None) -> ForwardOut:
        return self._run(model_id, datums, loss_fn, backward=True)

    def _run(self, model_id: str, datums: list[DatumIn], loss_fn: str, backward: bool) -> ForwardOut:
        if model_id not in self.w:
            raise EngineRequestError(f"unknown model {model_id}")
        if loss_fn != "cross_entropy":
            raise EngineRequestError(f"loss {loss_fn!r} is not in the fake engine")
        self.log.append(("forward_backward" if backward else "forward", model_id))
        time.sleep(self.delay.get(model_id, 0.0))
        w, outputs, loss = self.w[model_id], [], 0.0
        for datum in datums:
            lp = self._logprobs(w, datum.loss_fn_inputs["target_tokens"])
            weights = datum.loss_fn_inputs.get("weights", np.ones_like(lp))
            outputs.append({"logprobs": lp, "elementwise_loss": (-lp * weights).astype(np.float32)})
            loss += float((-lp * weights).sum())
            if backward:
                self.grad[model_id] += float(2 * w * weights.sum())
        out = ForwardOut(outputs, {"loss:sum": loss})
        self.returned.append((model_id, out))
        return out

    def optim_step(self, model_id: str, adam: AdamSpec) -> dict[str, float]:
        self.log.append(("optim_step", model_id))
        grad, self.grad[model_id] = self.grad[model_id], 0.0
        self.w[model_id] -= adam.learning_rate * float(np.sign(grad))
        return {"grad_norm:mean": abs(grad)}

    def save_weights(self, model_id: str, name: str, *, for_sampler: bool) -> str:
        key = f"{model_id}/{'sampler_weights' if for_sampler else 'weights'}/{name}"
        path = self.state_dir / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"w": self.w[model_id], "grad": self.grad[model_id]}))
        return key

    def load_weights(self, model_id: str, key: str, *, with_optimizer: bool) -> None:
        path = self.state_dir / f"{key}.json"
        if not path.exists():
            raise EngineRequestError(f"no checkpoint {key}", status=404)
        saved = json.loads(path.read_text())
        self.w[model_id] = saved["w"]

    def sample(self, target: SamplerTarget, prompt: list[int], num_samples: int, spec: SampleSpec, *,
               prompt_logprobs: bool = False) -> SampleOut:
        self.last_sample = (prompt, num_samples, spec, prompt_logprobs)
        w = 0.0 if target.weights is None else json.loads((self.state_dir / f"{target.weights}.json").read_text())["w"]
        time.sleep(self.delay.get(target.weights or BASE, 0.0))
        n = spec.max_tokens or 4
        seqs = []
        for k in range(num_samples):
            tokens = [(prompt[-1] + 1 + i + k) % VOCAB for i in range(n)]
            seqs.append(SampledOut(tokens, self._logprobs(w, np.array(tokens)).tolist(), "length"))
        prompt_lp = None
        if prompt_logprobs:
            prompt_lp = [None] + self._logprobs(w, np.array(prompt[1:])).tolist()
        out = SampleOut(seqs, prompt_lp)
        self.returned.append((target.weights or BASE, out))
        return out
