"""The whole-row forwards of the preference strategies, rm and distill on a context group
of 2 gloo processes: each rank's model sees only its half of the tokens, every rank gets
the one-process rows' response log-probs, rewards and per-token distillation losses, and
the group's gradients (each rank's loss being the whole rows') average to the
one-process gradient. Rows of 11 and 7 real tokens: odd, padded, with responses that
straddle the shard boundary."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from astrai_core.distributed.context import DistContext
from astrai_core.model import CausalLM, ModelConfig
from tests.distributed.spawn_kit import spawn_checks

pytest.importorskip("astrai_plugin_dpo")
pytest.importorskip("astrai_plugin_rm")
pytest.importorskip("astrai_plugin_distill")

WORLD = 2
TOL = 1e-5  # absolute, and relative for the gradients (of magnitude 10 here)


def _model(seed: int) -> CausalLM:
    torch.manual_seed(seed)
    config = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2,
                         num_heads=4, num_kv_heads=2, max_position_embeddings=64)
    model = CausalLM(config)
    model.reset_parameters(std=0.3)
    return model


def _batch() -> dict[str, torch.Tensor]:
    """Two right-padded rows of 11 and 7 real tokens; responses from token 4 and token 3."""
    ids = torch.randint(1, 40, (2, 11), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[1] * 11, [1] * 7 + [0] * 4])
    loss_mask = torch.tensor([[0] * 4 + [1] * 7, [0] * 3 + [1] * 4 + [0] * 4])
    positions = torch.arange(11).expand(2, 11).contiguous()
    return {"input_ids": ids * mask, "attention_mask": mask, "position_ids": positions,
            "loss_mask": loss_mask}


def _widths(models) -> list[int]:
    """The token widths the models' forwards see, appended as they run."""
    seen: list[int] = []
    for model in models:
        model.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    return seen


def _backward(out: torch.Tensor) -> None:
    """A loss that weighs every output differently."""
    probe = torch.rand(out.shape, generator=torch.Generator().manual_seed(1)) + 0.5
    (out * probe).sum().backward()


def _rewards(models, batch, context):
    from astrai_plugin_rm.scoring import new_score_head, sequence_rewards

    policy, _ = models
    if not hasattr(policy, "score"):
        torch.manual_seed(11)
        policy.score = new_score_head(32, 0.5, next(policy.parameters()))
    return sequence_rewards(policy, policy.score, batch["input_ids"], batch["attention_mask"],
                            pad_id=0, position_ids=batch["position_ids"], dist=context)[0]


def _response_logprobs(models, batch, context):
    from astrai_plugin_dpo.pairs import response_logprobs

    return response_logprobs(models[0], batch, context)[0]


def _distill_losses(models, batch, context):
    from astrai_plugin_distill.forward import student_token_losses
    from astrai_plugin_distill.losses import token_loss, with_nll
    from astrai_plugin_distill.teacher import teacher_head

    student, teacher = models
    mask = batch["loss_mask"][:, 1:].bool()
    forward = {"attention_mask": batch["attention_mask"], "position_ids": batch["position_ids"]}
    teacher_side = teacher_head(teacher, batch["input_ids"], mask, context, **forward)
    loss = with_nll(token_loss("jsd", beta=0.3))
    return student_token_losses(student, batch["input_ids"], mask, teacher_side, loss,
                                context, **forward)["token_loss"]


FORWARDS = {"response logprobs": _response_logprobs, "rewards": _rewards,
            "distill token losses": _distill_losses}


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The gradients the last backward left (none on a head no output depends on)."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _check(rank: int, case: str) -> None:
    models = (_model(7), _model(5).requires_grad_(False))
    batch, forward = _batch(), FORWARDS[case]
    expected = forward(models, batch, None)
    _backward(expected)
    expected_grads = _grads(models[0])
    models[0].zero_grad(set_to_none=True)
    seen = _widths(models)
    context = DistContext(rank=rank, world_size=WORLD, context_size=WORLD,
                          context_group=dist.group.WORLD)
    got = forward(models, batch, context)
    _backward(got)
    grads = _grads(models[0])
    for grad in grads.values():  # every collective before any assertion: no rank waits
        dist.all_reduce(grad)
        grad /= WORLD  # the group's average, as the gradient reduction takes it
    assert grads.keys() == expected_grads.keys()
    assert seen and set(seen) == {6}, seen  # 11 tokens padded to 12: 6 on each rank
    torch.testing.assert_close(got, expected, rtol=0, atol=TOL)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=TOL, atol=TOL, msg=name)


@pytest.mark.slow  # 2 spawned processes
@pytest.mark.parametrize("case", list(FORWARDS))
def test_whole_row_forwards_on_a_context_group_equal_one_process(tmp_path, case):
    spawn_checks(tmp_path, _check, case, world=WORLD)
