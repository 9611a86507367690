"""``TorchSampler(keep_unfinished=True)``: a call that continues the sequences the last
call left unfinished (their prompt plus their tokens, as partial rollouts send them)
computes only their last token, and samples what a sampler without kept rows samples,
with log-probs equal to the trainer's; rows kept under other weights are never used."""

from __future__ import annotations

import torch

from astrai_core.rollout import policy_forward
from astrai_core.sampling import SamplingParams, TorchSampler
from tests.sampling.conftest import VOCAB, batch_of, tiny_native

LENGTHS = [3, 8, 21, 40, 90]


def _prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(1, VOCAB, (n,), generator=generator).tolist() for n in LENGTHS]


def _params(segment: int, seed: int) -> list[SamplingParams]:
    return [SamplingParams(max_new_tokens=segment, temperature=1.0, seed=seed + i)
            for i in range(len(LENGTHS))]


def _counting(model) -> list[int]:
    """Positions fed to the model by forwards of more than one token (prefills)."""
    fed = [0]
    forward = model.forward

    def counting(input_ids, *args, **kwargs):
        if input_ids.shape[1] > 1:
            fed[0] += input_ids.numel()
        return forward(input_ids, *args, **kwargs)

    model.forward = counting
    return fed


def _assert_same(got, expected) -> None:
    for a, b in zip(got, expected, strict=True):
        assert a.token_ids == b.token_ids
        torch.testing.assert_close(torch.tensor(a.logprobs), torch.tensor(b.logprobs),
                                   atol=1e-5, rtol=0)


def _continued(first) -> list[list[int]]:
    return [p + c.token_ids for p, c in zip(_prompts(), first, strict=True)]


def test_continuing_a_segment_recomputes_nothing_and_samples_the_same():
    model = tiny_native(seed=4, context=256)
    kept, plain = TorchSampler(model=model, keep_unfinished=True), TorchSampler(model=model)
    first = kept.generate(_prompts(), _params(6, 100))
    assert [c.finish_reason for c in first] == ["length"] * len(LENGTHS)
    assert first == plain.generate(_prompts(), _params(6, 100))  # keeping changes nothing
    fed = _counting(model)
    try:
        again = kept.generate(_continued(first), _params(7, 200))
    finally:
        del model.forward
    assert fed[0] == 0  # every row's cache was kept: one forward of its last token only
    _assert_same(again, plain.generate(_continued(first), _params(7, 200)))
    for got, prompt in zip(again, _continued(first), strict=True):
        with torch.no_grad():
            batch = batch_of([prompt], [got])
            trainer = policy_forward(model, batch, temperature=1.0)
        assert (trainer["logprobs"] - batch.old_logprobs).abs()[batch.response_mask].max() <= 1e-5


def test_rows_kept_under_other_weights_are_not_used():
    """An in-place weight change (an optimizer step) or ``update_weights`` drops them: the
    continuation is prefilled afresh, with the new weights."""
    for change in ("in place", "update_weights"):
        model = tiny_native(seed=4, context=256)
        kept = TorchSampler(model=model, keep_unfinished=True)
        first = kept.generate(_prompts(), _params(6, 100))
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.mul_(1.1)
        if change == "update_weights":
            kept.update_weights(None)
        fed = _counting(model)
        try:
            again = kept.generate(_continued(first), _params(7, 200))
        finally:
            del model.forward
        assert fed[0] >= sum(len(p) for p in _continued(first)), change
        _assert_same(again, TorchSampler(model=model).generate(_continued(first), _params(7, 200)))


def test_only_the_continued_rows_are_reused():
    """New prompts beside continued ones: those are prefilled, the others are not."""
    model = tiny_native(seed=4, context=256)
    kept, plain = TorchSampler(model=model, keep_unfinished=True), TorchSampler(model=model)
    first = kept.generate(_prompts(), _params(6, 100))
    mixed = _continued(first)[:3] + [[7, 8, 9, 10, 11], [12] * 50]
    fed = _counting(model)
    try:
        again = kept.generate(mixed, _params(5, 300))
    finally:
        del model.forward
    assert 0 < fed[0] <= 2 * 55  # the two new prompts, padded to the batch at most
    _assert_same(again, plain.generate(mixed, _params(5, 300)))
