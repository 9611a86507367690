"""The ``tools`` environment's schemas reach the chat template of every prompt
(``apply_chat_template(tools=...)``), train and eval alike, unless ``tools_in_prompt: false``."""

from __future__ import annotations

import shutil

from astrai_core.environments.tools import Tools
from astrai_core.testing import ARITH_TOKENIZER, build_strategy, tiny_run_config, write_arith_prompts

CALCULATOR = "astrai_core.environments.calculator:calculator"
# A template that renders tools, as Qwen's and Hermes' do: here the number of tools, in a
# system turn the arithmetic tokenizer can spell.
TOOLS_FIRST = "{%- if tools -%}<|system|>{{ tools | length }}<|end|>{%- endif -%}"


def _tokenizer_rendering_tools(tmp_path):
    directory = tmp_path / "tokenizer"
    shutil.copytree(ARITH_TOKENIZER, directory)
    template = directory / "chat_template.jinja"
    template.write_text(TOOLS_FIRST + template.read_text())
    return directory


def _run(tmp_path, **tool_options):
    prompts = write_arith_prompts(tmp_path / "prompts.jsonl", count=8)
    config = tiny_run_config(tmp_path, prompts, {"name": "grpo", "group_size": 2},
                             data={"eval": {"path": str(prompts), "format": "prompt"}})
    config["model"]["tokenizer"] = str(_tokenizer_rendering_tools(tmp_path))
    config["environment"] = {"name": "tools", "tools": [CALCULATOR], **tool_options}
    _, run = build_strategy(config, tmp_path)
    return run


def _first_texts(loader):
    return [record.prompt_text for record in next(iter(loader))]


def test_every_prompt_carries_the_tool_schemas(tmp_path):
    run = _run(tmp_path)
    assert run.episodes.environment.prompt_tools == Tools(tools=[CALCULATOR]).schemas
    for texts in (_first_texts(run.train_loader), _first_texts(run.eval_loader)):
        assert texts and all(t.startswith("<|system|>1<|end|><|user|>") for t in texts)


def test_tools_in_prompt_false_leaves_the_prompts_alone(tmp_path):
    run = _run(tmp_path, tools_in_prompt=False)
    assert run.episodes.environment.prompt_tools is None
    for texts in (_first_texts(run.train_loader), _first_texts(run.eval_loader)):
        assert texts and all(t.startswith("<|user|>") for t in texts)
