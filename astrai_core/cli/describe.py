"""`astrai describe [KIND [NAME]]`: the kinds, the components of a kind, a component's options.

``astrai describe`` lists the component kinds, ``astrai describe KIND`` the names of that
kind with their summaries, and ``astrai describe KIND NAME`` the options of that component
(its config section's keys) with types, defaults and descriptions, taken from its pydantic
``Config`` or, when it has none, from its constructor's keyword arguments. Listing never
imports torch; describing a component imports its target (which may).
"""

from __future__ import annotations

import argparse
import inspect
import json
from typing import Any

from astrai_core.cli.options import (
    Option,
    accepts_any_keyword,
    config_model,
    keyword_options,
    model_options,
)
from astrai_core.errors import AstraiError, PluginError

# kind -> where a run config (or the CLI) selects a component of that kind.
WHERE_CONFIGURED: dict[str, str] = {
    "strategy": "strategy: {name: NAME, ...}",
    "advantage_estimator": "advantage: {name: NAME, ...}",
    "sampler": "sampler: {name: NAME, ...}",
    "model_importer": "astrai import SRC DST --importer NAME",
    "device_backend": "device: {name: NAME, ...}",
    "reward_function": "rewards: [{name: NAME, weight: 1.0, ...}]",
    "policy_loss": "strategy: {policy_loss: {name: NAME, ...}}",
    "environment": "environment: {name: NAME, ...}",
    "tracker": "trainer: {report_to: [NAME, {name: NAME, ...}]}",
}
# Other spellings a user may type for a kind: the config section names and hyphens.
KIND_ALIASES = {"advantage": "advantage_estimator", "device": "device_backend",
                "reward": "reward_function", "rewards": "reward_function",
                "importer": "model_importer", "report_to": "tracker", "trackers": "tracker"}
# A reward function's first two parameters are the texts; the others are data columns.
REWARD_TEXT_PARAMETERS = ("prompts", "completions")


class DescribeError(AstraiError):
    """Unknown kind or name for `astrai describe` (exit 2)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kind", nargs="?", help="component kind (e.g. strategy, sampler)")
    parser.add_argument("name", nargs="?", help="component name (e.g. ppo)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from astrai_core.plugins import process_registry

    registry = process_registry()
    if args.kind is None:
        _emit(args.json, _kinds(registry), _print_kinds)
        return 0
    kind = resolve_kind(args.kind)
    if args.name is None:
        _emit(args.json, _names(registry, kind), _print_names)
        return 0
    _emit(args.json, describe_component(registry, kind, args.name), _print_component)
    return 0


def resolve_kind(text: str) -> str:
    from astrai_core.plugins.specs import KINDS

    kind = text.replace("-", "_").lower()
    kind = KIND_ALIASES.get(kind, kind)
    if kind not in KINDS:
        raise DescribeError(f"unknown component kind {text!r}; kinds are: {', '.join(KINDS)}")
    return kind


def describe_component(registry: Any, kind: str, name: str) -> dict[str, Any]:
    """Everything `describe KIND NAME` shows, as plain data."""
    try:
        spec = registry.get(kind, name)
    except PluginError as error:
        raise DescribeError(str(error)) from None
    plugin = registry.provider(kind, name)
    try:
        target = spec.load()
    except Exception as error:  # a broken plugin module: say which, never a traceback
        raise PluginError(f"{kind} {name!r} ({spec.target}) from {plugin.distribution} "
                          f"cannot be loaded: {type(error).__name__}: {error}") from None
    options, source = component_options(kind, target)
    extra = {field: getattr(spec, field) for field in type(spec).model_fields
             if field not in ("name", "target", "summary")}
    return {
        "kind": kind, "name": name, "summary": spec.summary, "target": spec.target,
        "plugin": plugin.name, "distribution": plugin.distribution, "version": plugin.version,
        "configured_as": WHERE_CONFIGURED.get(kind, "").replace("NAME", name),
        "doc": _first_paragraph(_own_doc(target)),
        "spec": {key: list(value) if isinstance(value, tuple) else value
                 for key, value in extra.items()},
        "reads": reward_inputs(target) if kind == "reward_function" else [],
        "options_from": source,
        "options": [_option_json(option) for option in options],
    }


def component_options(kind: str, target: Any) -> tuple[list[Option], str]:
    """(rows, where they come from): the pydantic Config, or the keyword arguments."""
    model = config_model(target)
    if model is not None:
        options = model_options(model)
        return options, f"{model.__module__}.{model.__qualname__}" if options else "none"
    rows = keyword_options(target)
    if kind == "reward_function" and not inspect.isclass(target):
        # a plain reward function: its extra parameters are dataset columns, not options
        return [], "none (a reward function without options)"
    if kind in ("strategy", "sampler") and inspect.isclass(target):
        return [], "none"  # built with (config, context) / (model=...) by astrai itself
    if accepts_any_keyword(target):
        return rows, "keyword arguments (any other **params are accepted too)"
    return rows, "keyword arguments" if rows else "none"


def reward_inputs(target: Any) -> list[str]:
    """What a reward reads besides the texts: data columns (``answer``) or runner inputs
    (``completion_ids``), as named by its parameters."""
    call = target if not inspect.isclass(target) else getattr(target, "__call__", None)
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.name not in (*REWARD_TEXT_PARAMETERS, "self")
            and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]


def _kinds(registry: Any) -> list[dict[str, Any]]:
    from astrai_core.plugins.specs import KINDS

    return [{"kind": kind, "configured_as": WHERE_CONFIGURED.get(kind, ""),
             "names": registry.names(kind)} for kind in KINDS]


def _names(registry: Any, kind: str) -> list[dict[str, Any]]:
    return [{"name": spec.name, "summary": spec.summary,
             "plugin": registry.provider(kind, spec.name).name}
            for spec in registry.specs(kind)]


def _option_json(option: Option) -> dict[str, Any]:
    return {"name": option.name, "type": option.type, "default": option.default,
            "required": option.required, "description": option.description}


def _own_doc(target: Any) -> str | None:
    """The target's own docstring (a subclass without one does not show its base's)."""
    doc = target.__dict__.get("__doc__") if inspect.isclass(target) else target.__doc__
    return inspect.cleandoc(doc) if doc else None


def _first_paragraph(doc: str | None) -> str:
    return " ".join((doc or "").split("\n\n", 1)[0].split())


def _emit(as_json: bool, data: Any, printer: Any) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        printer(data)


# -- terminal rendering ------------------------------------------------------------------
def _console():
    from astrai_core.cli.output import console

    return console()


def _table(*columns: str):
    """A borderless table; the first column (a name) keeps its cells on one line."""
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column(columns[0], no_wrap=True)
    for column in columns[1:]:
        table.add_column(column, overflow="fold")
    return table


def _print_kinds(kinds: list[dict[str, Any]]) -> None:
    table = _table("kind", "selected by", "names")
    for row in kinds:
        table.add_row(row["kind"], row["configured_as"], ", ".join(row["names"]) or "-")
    console = _console()
    console.print(table)
    console.print("\n`astrai describe KIND` lists a kind's components; "
                  "`astrai describe KIND NAME` shows a component's options.", highlight=False)


def _print_names(names: list[dict[str, Any]]) -> None:
    table = _table("name", "plugin", "summary")
    for row in names:
        table.add_row(row["name"], row["plugin"], row["summary"])
    _console().print(table)


def _print_component(info: dict[str, Any]) -> None:
    from rich.markup import escape

    console = _console()
    version = f" {info['version']}" if info["version"] else ""
    console.print(f"[bold]{info['kind']} {info['name']}[/] — {escape(info['summary'])}")
    console.print(f"from {info['distribution']}{version} ({info['target']})", highlight=False)
    if info["configured_as"]:
        console.print(f"config: {escape(info['configured_as'])}", highlight=False)
    for key, value in info["spec"].items():
        if value not in (None, [], ()):
            console.print(f"{key}: {value}", highlight=False)
    if info["reads"]:
        console.print(f"reads (besides prompts, completions): {', '.join(info['reads'])}",
                      highlight=False)
    if info["doc"]:
        console.print(f"\n{escape(info['doc'])}", highlight=False)
    if not info["options"]:
        console.print(f"\noptions: {info['options_from']}", highlight=False)
        return
    console.print(f"\noptions ({escape(info['options_from'])}):", highlight=False)
    table = _table("option", "type", "default", "description")
    for option in info["options"]:
        table.add_row(option["name"], escape(option["type"]), escape(option["default"]),
                      escape(option["description"]))
    console.print(table)
