"""An image-conditioned reward model on tiny vision-language models: the rm strategy's
reward is its score head on transformers' own last hidden state of the rows with their
images, training on image pairs lowers the pairwise loss, and the trained checkpoint,
used as the reward_model reward, scores a templated prompt with its images as
transformers and the head do."""

from __future__ import annotations

import pytest
import torch

from astrai_core.config.schema import RunConfig
from astrai_core.testing import build_strategy, read_metrics
from astrai_core.testing.hf_vlms import tiny_image
from astrai_core.testing.vlm_rows import (image_chat, transformers_inputs, vlm_run_config,
                                          write_image_pairs, write_vlm_dirs)
from astrai_core.training.run import train

ROWS = 4


@pytest.fixture(scope="module")
def vlm_dirs(tmp_path_factory):
    return write_vlm_dirs(tmp_path_factory.mktemp("vlms"))


def _transformers_reward(hf, weight, processor, i, answer):
    """The head on transformers' last hidden state (the language model's, after its final
    norm) at the chat's last token, row i's image in the forward."""
    inputs = transformers_inputs(processor, i, answer)
    with torch.no_grad():
        hidden = hf.model(**inputs).last_hidden_state[0, -1]
    return (hidden.double() @ weight[0].double()).item()


@pytest.mark.parametrize("family", ["gemma3", "llava", "idefics3"])
def test_rm_reward_on_images_equals_transformers_hidden_state_and_head(tmp_path, vlm_dirs,
                                                                       family):
    from transformers import AutoProcessor

    data = write_image_pairs(tmp_path / "data", ROWS)
    config = vlm_run_config(tmp_path, vlm_dirs[family], data,
                            {"name": "rm", "head_init_std": 0.5})
    strategy, run = build_strategy(config, tmp_path)
    batch = strategy.to_device(strategy.batch_source().next_step()[0])
    with torch.no_grad():
        chosen, rejected, _ = strategy.rewards(batch)
    processor = AutoProcessor.from_pretrained(str(vlm_dirs[family]))
    weight = strategy.score.weight.detach()
    for i in range(ROWS):
        for rewards, answer in ((chosen, i + 1), (rejected, i + 2)):
            expected = _transformers_reward(run.model.hf, weight, processor, i, str(answer))
            assert rewards[i].item() == pytest.approx(expected, abs=1e-5)
    # the images reach the forward: each row given another row's image, other rewards
    swapped = dict(batch)
    for key in [k for k in batch if k.endswith("image/pixel_values")]:
        swapped[key] = batch[key].roll(1, dims=0)
    with torch.no_grad():
        other, _, _ = strategy.rewards(swapped)
    assert (other - chosen).abs().max() > 1e-4


def test_rm_trains_on_image_pairs_and_scores_images_as_a_reward(tmp_path, vlm_dirs):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from astrai_plugin_rm.reward_model import RewardModelReward

    steps = 6
    data = write_image_pairs(tmp_path / "data", ROWS)
    config = vlm_run_config(tmp_path, vlm_dirs["gemma3"], data, {"name": "rm"}, steps=steps)
    train(RunConfig.model_validate(config))
    losses = [record["loss"] for record in read_metrics(tmp_path / "run")]
    assert losses[-1] < 0.75 * losses[0], losses

    step = tmp_path / "run" / "checkpoints" / f"step_{steps}"
    processor = AutoProcessor.from_pretrained(str(step))
    hf = AutoModelForImageTextToText.from_pretrained(str(step), dtype=torch.float32).eval()
    weight = load_file(str(step / "score.safetensors"))["weight"]
    prompts = [processor.apply_chat_template(image_chat(i), tokenize=False,
                                             add_generation_prompt=True) for i in range(ROWS)]
    answers = [str(i + 1) for i in range(ROWS)]
    reward = RewardModelReward(path=str(step), batch_size=3, device="cpu")
    scores = reward(prompts, answers, images=[[tiny_image(i)] for i in range(ROWS)])
    expected = [_transformers_reward(hf, weight, processor, i, answers[i]) for i in range(ROWS)]
    assert scores == pytest.approx(expected, abs=1e-5)
    # images as paths, beside a prompt without any: the same scores, and a text row's own
    paths = [str(data.parent / f"{i}.png") for i in range(ROWS)]
    again = reward(prompts + ["1+1="], answers + ["2"], images=[[p] for p in paths] + [None])
    assert again[:ROWS] == pytest.approx(expected, abs=1e-5)

