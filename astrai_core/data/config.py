"""The ``data:`` section of a run config."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Format = Literal["text", "chat", "preference", "unpaired", "prompt", "prompt_completion",
                 "stepwise", "auto"]
# Which formats produce which kind of batch; mixed sources must share one kind.
BATCH_KIND = {"text": "sequence", "chat": "sequence", "prompt_completion": "sequence",
              "preference": "preference", "unpaired": "unpaired", "prompt": "prompt"}
STEPWISE_REFUSAL = ("stepwise supervision (prompt, completions, labels) trains a process "
                    "reward model, which no astrai strategy does; the formats astrai trains "
                    "are text, chat, prompt_completion, preference, unpaired and prompt")
DEFAULT_CACHE_DIR = Path(".cache/astrai/data")


def mixed_batches(formats: list[str]) -> str | None:
    """Why sources of these formats cannot be mixed (they make different batches), or None."""
    kinds = {BATCH_KIND[f] for f in formats if f != "auto"}
    if len(kinds) < 2:
        return None
    return (f"sources mix formats that make different batches ({', '.join(sorted(set(formats)))}); "
            "text and chat mix, and prompt_completion with them; the other formats only with "
            "themselves")


class _Rows(BaseModel):
    """Where a source's rows come from and how they are shaped."""

    model_config = ConfigDict(extra="forbid")

    path: Path | str
    """A ``.jsonl``, ``.json``, ``.parquet``, ``.csv`` or ``.arrow`` file, a directory
    written by ``datasets.save_to_disk``, or ``hf://NAME`` (a Hugging Face hub dataset);
    relative paths in a run config are relative to the current directory."""
    format: Format
    """``text`` ({"text"}), ``chat`` ({"messages"}), ``prompt_completion`` (prompt/messages
    + completion), ``preference`` (prompt/messages + chosen + rejected, or chosen +
    rejected conversations sharing their prompt), ``unpaired`` (prompt/messages +
    completion + label: true for a desirable completion), ``prompt`` (prompt/messages +
    any other columns), or ``auto``: recognised by the columns of the first row (the run
    log says which). A ``prompt`` may be a string or a list of messages; see
    docs/from-trl.md for TRL's dataset formats."""
    split: str = "train"
    """The split of a hub dataset or of a save_to_disk DatasetDict."""
    subset: str | None = None
    """The subset (configuration) of a hub dataset, e.g. ``main`` for ``openai/gsm8k``."""
    transform: str | None = Field(None, pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
    """``module:function`` applied to each row (a dict) after the renames; it returns the
    row to use."""
    chat_template: bool | None = None
    """This source's string prompts: wrapped as one user turn with the tokenizer's chat
    template (true) or fed as raw text (false); default ``data.chat_template``."""

    @field_validator("format")
    @classmethod
    def _trainable(cls, value: str) -> str:
        if value == "stepwise":
            raise ValueError(STEPWISE_REFUSAL)
        return value

    @field_validator("path", mode="before")
    @classmethod
    def _hub_names_stay_text(cls, value: Any) -> Any:
        """``hf://NAME`` is not a file path (``Path`` would fold its ``//``)."""
        if isinstance(value, str) and not value.startswith("hf://"):
            return Path(value)
        return value

    @property
    def renames(self) -> dict[str, str]:
        columns = getattr(self, "columns", None)
        return dict(columns) if isinstance(columns, dict) else {}


class SourceConfig(_Rows):
    """One training source."""

    weight: float = Field(1.0, gt=0)
    """Relative sampling weight when several sources are mixed (per example drawn)."""
    columns: list[str] | dict[str, str] | None = None
    """A mapping renames columns (``{question: prompt, answer: answer}``: source name ->
    the name astrai reads). A list declares the columns every row carries besides the
    prompt (``prompt`` format): the run plan then checks before any work that each reward
    finds the columns it needs."""


class EvalSourceConfig(_Rows):
    """The evaluation source, read in order, unshuffled."""

    columns: dict[str, str] | None = None
    """Renames columns: source name -> the name astrai reads."""


class NamedEvalSourceConfig(EvalSourceConfig):
    """One of several named evaluation sets; its metrics are ``eval/<name>/...``."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$")
    """Lower-case letters, digits, '_' and '-': the metric prefix ``eval/<name>/``."""


class DataConfig(BaseModel):
    """Training data: sources, batching, packing, shuffling and the token cache."""

    model_config = ConfigDict(extra="forbid")

    sources: list[SourceConfig] = Field(min_length=1)
    """Training files; with several, each example is drawn from a source chosen at
    random in proportion to ``weight`` (deterministic given ``seed``)."""
    eval: EvalSourceConfig | None = None
    """Optional held-out file for evaluation (its metrics: ``eval/...``)."""
    eval_sets: list[NamedEvalSourceConfig] = Field(default_factory=list)
    """More evaluation sets, each with a ``name``, evaluated alongside ``eval`` (metrics
    ``eval/<name>/...``, e.g. ``eval/gsm8k/accuracy``)."""
    seq_len: int = Field(512, ge=2)
    """Tokens per row. Longer sequences are truncated (see ``overflow``)."""
    pack: bool = True
    """Pack several documents into each row of exactly ``seq_len`` tokens (text and
    chat). Off: one example per row, right-padded to the longest row of the batch. A
    strategy that needs one example per row (distill sampling replies) turns it off
    unless it is given."""
    overflow: Literal["truncate", "split"] = "truncate"
    """Documents longer than ``seq_len``: ``truncate`` keeps the first ``seq_len`` tokens;
    ``split`` cuts them into ``seq_len`` pieces trained as separate documents."""
    batch_size: int = Field(8, ge=1)
    """Rows per training batch (prompts per batch for the ``prompt`` format)."""
    eval_batch_size: int | None = Field(None, ge=1)
    """Rows per evaluation batch; defaults to ``batch_size``."""
    shuffle: bool = True
    """Shuffle each source anew every epoch (a permutation seeded by seed and epoch)."""
    seed: int = 0
    """Seed of the shuffles and of the source mixing."""
    cache_dir: Path | None = None
    """Where tokenized sources are cached; default ``.cache/astrai/data`` under the
    current directory. A relative path given here is relative to the current directory."""
    chat_template: bool = True
    """A string ``prompt`` of ``prompt`` rows, for a tokenizer with a chat template, is
    wrapped as one user turn and rendered with the template and its generation prompt
    (as conversational data is). False feeds string prompts as raw text (a base model, or
    data already templated). A source's own ``chat_template`` overrides it."""
    completion_only_loss: bool = True
    """``prompt_completion`` rows: train on the completion only (as TRL's SFT does by
    default). False: on the prompt's tokens as well."""
    max_prompt_len: int | None = Field(None, ge=1)
    """Prompt format: prompts with more tokens are skipped (one warning with their count,
    and the ``data/prompts_skipped`` metric). Default: what the model's context
    (``max_position_embeddings``) leaves after the generation (``sampler.max_new_tokens``
    for rollouts, ``trainer.eval_max_new_tokens`` for evaluation)."""

    @model_validator(mode="after")
    def _one_batch_kind(self) -> DataConfig:
        problem = mixed_batches([s.format for s in self.sources])
        if problem:
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _unique_eval_names(self) -> DataConfig:
        names = [s.name for s in self.eval_sets]
        for name in names:
            if names.count(name) > 1:
                raise ValueError(f"eval_sets: the name {name!r} is used twice")
        return self

    def wraps_prompts(self, source: _Rows) -> bool:
        """Whether ``source``'s string prompts go through the chat template."""
        return self.chat_template if source.chat_template is None else source.chat_template

    def named_evals(self) -> list[tuple[str | None, EvalSourceConfig]]:
        """``(None, eval)`` then ``(name, set)`` for each named set."""
        unnamed = [(None, self.eval)] if self.eval is not None else []
        return [*unnamed, *((s.name, s) for s in self.eval_sets)]

    def resolve_paths(self, base_dir: str | Path) -> DataConfig:
        """A copy with relative source, eval and cache paths made absolute under
        ``base_dir`` (`astrai train` passes the current directory); the default cache
        dir under the cwd."""
        base = Path(base_dir)

        def resolve(path: Path | str) -> Path | str:
            if isinstance(path, str):  # hf://NAME
                return path
            return path if path.is_absolute() else (base / path).resolve()

        sources = [s.model_copy(update={"path": resolve(s.path)}) for s in self.sources]
        eval_source = (self.eval.model_copy(update={"path": resolve(self.eval.path)})
                       if self.eval else None)
        eval_sets = [s.model_copy(update={"path": resolve(s.path)}) for s in self.eval_sets]
        cache_dir = resolve(self.cache_dir) if self.cache_dir else DEFAULT_CACHE_DIR.resolve()
        return self.model_copy(update={"sources": sources, "eval": eval_source,
                                       "eval_sets": eval_sets,
                                       "cache_dir": cache_dir})
