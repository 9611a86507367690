"""Build the train and eval loaders of a ``DataConfig`` (tokenizing through the cache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from astrai_core.data.columns import Required, check_required_columns
from astrai_core.data.config import BATCH_KIND, DEFAULT_CACHE_DIR, DataConfig
from astrai_core.data.loader import (EvalLoader, PreferenceLoader, PromptExamples, PromptLoader,
                                     SequenceLoader, UnpairedLoader, unpaired_labels)
from astrai_core.data.mixing import ExampleStream
from astrai_core.data.packing import SequenceExamples
from astrai_core.data.render import wraps_string_prompts
from astrai_core.data.tokenize import RenderOptions, TokenizedSource, tokenize_source
from astrai_core.data.vision_render import field_tensors
from astrai_core.errors import DataError
from astrai_core.log import get_logger

log = get_logger(__name__)


def check_image_rows(source: TokenizedSource, cfg: DataConfig, field: str) -> None:
    """Rows with images are trained whole, one per batch row: packing them is refused
    when ``data.pack: true`` is set (a row's image features fill its image tokens, and
    packed rows would need every document's images placed and attended apart; left
    unset, such data is not packed), and so is cutting one at ``seq_len`` (its image
    tokens would no longer match its images)."""
    if not has_image_rows(source):
        return
    if cfg.pack and "pack" in cfg.model_fields_set and "input" in source.fields:
        raise DataError(f"{field}: {source.path} has rows with images, which are not packed "
                        "(data.pack: true); leave data.pack out or set it false")
    for ragged in source.fields.values():  # a pair's two responses alike
        lengths = ragged.lengths()
        for row in source.images.names:
            if lengths[row] > cfg.seq_len:
                raise DataError(f"{field}: {source.path}, row {row + 1} with images is "
                                f"{int(lengths[row])} tokens, over data.seq_len "
                                f"{cfg.seq_len}; rows with images are never cut: raise "
                                "data.seq_len")


def has_image_rows(source: TokenizedSource) -> bool:
    return source.images is not None and bool(source.images.names)


def _pad_id(tokenizer: Any) -> int:
    # Padding is told apart by attention_mask, so the id only has to be a valid one.
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def _loader(cfg: DataConfig, tokenizer: Any, fmt: str, sources: list[TokenizedSource],
            weights: list[float], fields: list[str], *, batch_size: int, shuffle: bool,
            finite: bool) -> Any:
    """A loader of the batch kind of ``fmt`` reading ``sources``."""
    kind = BATCH_KIND[fmt]
    if kind != "prompt":
        for source, field in zip(sources, fields):
            check_image_rows(source, cfg, field)
    if kind == "sequence":
        examples = [SequenceExamples(s.fields["input"], cfg.seq_len, cfg.overflow, s.images)
                    for s in sources]
    elif kind == "preference":  # pairs are never split: a piece would lose its prompt
        # both responses follow the prompt's images (data/vision_rows.py)
        examples = [tuple(SequenceExamples(s.fields[side], cfg.seq_len,
                                           images=field_tensors(s.images, side))
                          for side in ("chosen", "rejected")) for s in sources]
        assert all(len(c) == len(r) for c, r in examples)  # both sides always have tokens
    elif kind == "unpaired":  # one completion per row, never split, with its label
        examples = [(SequenceExamples(s.fields["completion"], cfg.seq_len,
                                      images=field_tensors(s.images, "completion")),
                     unpaired_labels(s)) for s in sources]
    else:
        examples = [PromptExamples(s, cfg.max_prompt_len, f) for s, f in zip(sources, fields)]
    sizes = [len(e[0]) if kind in ("preference", "unpaired") else len(e) for e in examples]
    stream = ExampleStream(sizes, weights, seed=cfg.seed, shuffle=shuffle,
                           finite=finite)
    if kind == "sequence":
        pack = cfg.pack and not any(has_image_rows(s) for s in sources)
        return SequenceLoader(examples, stream, batch_size=batch_size, seq_len=cfg.seq_len,
                              pack=pack, pad_id=_pad_id(tokenizer))
    if kind == "preference":
        return PreferenceLoader(examples, stream, batch_size=batch_size, pad_id=_pad_id(tokenizer),
                                margins=[s.margins for s in sources])
    if kind == "unpaired":
        return UnpairedLoader(examples, stream, batch_size=batch_size, pad_id=_pad_id(tokenizer))
    return PromptLoader(examples, stream, batch_size=batch_size)


def _cache_dir(cfg: DataConfig) -> Path:
    return cfg.cache_dir if cfg.cache_dir is not None else DEFAULT_CACHE_DIR.resolve()


def _prepare(cfg: DataConfig, base_dir: str | Path | None) -> DataConfig:
    return cfg.resolve_paths(base_dir) if base_dir is not None else cfg


def _as_jsonl(cfg: DataConfig, source: Any, field: str) -> Any:
    """``source`` reading a JSONL file: itself, or the checked rows of a Parquet/CSV/Arrow/
    hub/renamed/transformed source, written once (see :mod:`astrai_core.data.datasets_io`)."""
    from astrai_core.data.datasets_io import materialize, needs_datasets

    if not needs_datasets(source):
        return source
    return source.model_copy(update={"path": materialize(source, _cache_dir(cfg), field),
                                     "columns": None, "transform": None})


def _origin(source: Any) -> Any:
    """The user's path of a source read through ``datasets`` (its rows are then written to
    a JSONL in the cache, which errors must not name), else None."""
    from astrai_core.data.datasets_io import needs_datasets

    return source.path if needs_datasets(source) else None


def _tokenized(cfg: DataConfig, source: Any, tokenizer: Any, field: str,
               tools: list[dict] | None) -> TokenizedSource:
    """``source`` tokenized with the data section's rendering options; for prompt rows the
    log says once how string prompts are rendered."""
    wrap = cfg.wraps_prompts(source)
    if source.format == "prompt":
        if wraps_string_prompts(tokenizer, wrap):
            how = ("wrapped as one user turn with the tokenizer's chat template "
                   "(chat_template: false feeds them as raw text)")
        else:
            how = ("fed as raw text (" + ("chat_template: false" if not wrap
                                          else "the tokenizer has no chat template") + ")")
        log.info(f"{field.removesuffix('.path')}: string prompts are {how}", chat_template=wrap)
    options = RenderOptions(chat_template=wrap, completion_only_loss=cfg.completion_only_loss)
    return tokenize_source(source.path, source.format, tokenizer, _cache_dir(cfg), field, tools,
                           options)


def _check_formats(formats: tuple[str, ...] | None, fmt: str, field: str) -> None:
    if formats is not None and fmt not in formats:
        raise DataError(f"{field}: format {fmt!r} is not accepted here; expected "
                        f"{' or '.join(repr(f) for f in formats)}")


def build_train_loader(cfg: DataConfig, tokenizer: Any, *, base_dir: str | Path | None = None,
                       formats: tuple[str, ...] | None = None,
                       required_columns: Required | None = None,
                       tools: list[dict] | None = None,
                       ) -> SequenceLoader | PreferenceLoader | UnpairedLoader | PromptLoader:
    """The endless, resumable training loader.

    ``base_dir``: resolve relative paths against it (`astrai train` passes the current
    directory); without it, ``cfg`` paths are used as they are. ``formats``: the source formats the caller
    accepts (e.g. a strategy's); another format is a DataError naming the field.
    ``required_columns``: {reward: columns} every prompt row must carry (DataError naming
    the file, line and column otherwise). ``tools``: OpenAI tool schemas for the chat
    template of prompt rows (the environment's ``prompt_tools``).
    """
    from astrai_core.data.auto_format import resolve_auto

    cfg = resolve_auto(_prepare(cfg, base_dir), formats, None)
    fields = [f"data.sources[{i}].path" for i in range(len(cfg.sources))]
    given = cfg.sources
    cfg = cfg.model_copy(update={"sources": [_as_jsonl(cfg, s, f)
                                             for s, f in zip(cfg.sources, fields)]})
    for i, source in enumerate(cfg.sources):
        _check_formats(formats, source.format, f"data.sources[{i}].format")
    sources = [_tokenized(cfg, s, tokenizer, f, tools) for s, f in zip(cfg.sources, fields)]
    for source, field, user in zip(sources, fields, given):
        check_required_columns(source, required_columns, field, _origin(user))
    loader = _loader(cfg, tokenizer, cfg.sources[0].format, sources,
                     [s.weight for s in cfg.sources], fields, batch_size=cfg.batch_size,
                     shuffle=cfg.shuffle, finite=False)
    _report_skipped(loader, "data.sources", cfg.max_prompt_len)
    return loader


def _report_skipped(loader: Any, field: str, max_prompt_len: int | None) -> None:
    """One warning, once per loader built, counting the prompts it skips as too long."""
    skipped = getattr(loader, "skipped", 0)
    if skipped:
        log.warning(f"{field}: skipped {skipped} prompt(s) longer than "
                    f"data.max_prompt_len={max_prompt_len} tokens", skipped=skipped)


def build_eval_loader(cfg: DataConfig, tokenizer: Any, *, base_dir: str | Path | None = None,
                      formats: tuple[str, ...] | None = None,
                      required_columns: Required | None = None,
                      tools: list[dict] | None = None) -> EvalLoader | None:
    """One pass over ``cfg.eval`` in file order per iteration, or None without one.
    ``base_dir``, ``formats``, ``required_columns`` and ``tools`` as for
    ``build_train_loader``."""
    from astrai_core.data.auto_format import resolve_auto

    cfg = _prepare(cfg, base_dir)
    if cfg.eval is None:
        return None
    cfg = resolve_auto(cfg, None, formats)
    _check_formats(formats, cfg.eval.format, "data.eval.format")
    field = "data.eval.path"
    origin = _origin(cfg.eval)
    cfg = cfg.model_copy(update={"eval": _as_jsonl(cfg, cfg.eval, field)})
    source = _tokenized(cfg, cfg.eval, tokenizer, field, tools)
    check_required_columns(source, required_columns, field, origin)
    batch_size = cfg.eval_batch_size or cfg.batch_size

    def make() -> Any:
        return _loader(cfg, tokenizer, cfg.eval.format, [source], [1.0], [field],
                       batch_size=batch_size, shuffle=False, finite=True)

    _report_skipped(make(), field, cfg.max_prompt_len)  # fail now if the source is unusable
    return EvalLoader(make, BATCH_KIND[cfg.eval.format])
