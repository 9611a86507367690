"""String prompts of prompt rows: one user turn through the chat template by default,
raw text with ``chat_template: false`` (per data section or per source), said once in
the log; the cache keeps the two renderings apart."""

from __future__ import annotations

import pytest
import structlog

from astrai_core.data import DataConfig, build_eval_loader, build_train_loader


@pytest.fixture(autouse=True)
def _logging_restored():
    yield
    structlog.reset_defaults()


def _prompts(loader):
    return [r.prompt_text for r in next(iter(loader))]


def test_per_source_choice_overrides_the_data_section(write_jsonl, tmp_path, arith_tokenizer,
                                                      capsys):
    path = write_jsonl("p.jsonl", [{"prompt": "1+2=", "answer": "3"}])
    source = {"path": str(path), "format": "prompt"}
    wrapped = DataConfig(sources=[source], eval=source, cache_dir=tmp_path / "cache",
                         batch_size=1, shuffle=False)
    assert _prompts(build_train_loader(wrapped, arith_tokenizer)) == [
        "<|user|>1+2=<|end|><|assistant|>"]
    raw_eval = wrapped.model_copy(update={"eval": wrapped.eval.model_copy(
        update={"chat_template": False})})
    assert _prompts(build_eval_loader(raw_eval, arith_tokenizer)) == ["1+2="]
    everywhere_raw = wrapped.model_copy(update={"chat_template": False})
    assert _prompts(build_train_loader(everywhere_raw, arith_tokenizer)) == ["1+2="]
    back_on = everywhere_raw.model_copy(update={"sources": [wrapped.sources[0].model_copy(
        update={"chat_template": True})]})
    assert _prompts(build_train_loader(back_on, arith_tokenizer)) == [
        "<|user|>1+2=<|end|><|assistant|>"]
    out = capsys.readouterr().out
    assert out.count("data.sources[0]: string prompts are wrapped as one user turn") == 2
    assert out.count("data.eval: string prompts are fed as raw text (chat_template: false)") == 1
    assert out.count("data.sources[0]: string prompts are fed as raw text") == 1


def test_a_tokenizer_without_a_template_gets_the_raw_text(write_jsonl, tmp_path, arith_tokenizer,
                                                          capsys):
    import copy

    plain = copy.deepcopy(arith_tokenizer)
    plain.chat_template = None
    path = write_jsonl("p.jsonl", [{"prompt": "1+2=", "answer": "3"}])
    cfg = DataConfig(sources=[{"path": str(path), "format": "prompt"}],
                     cache_dir=tmp_path / "cache", batch_size=1)
    assert _prompts(build_train_loader(cfg, plain)) == ["1+2="]
    assert "fed as raw text (the tokenizer has no chat template)" in capsys.readouterr().out
