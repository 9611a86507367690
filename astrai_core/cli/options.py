"""The options of a config model or a component, as rows a human can read.

Shared by `astrai describe` and the configuration reference generator. Every row has a
name, a type (with its pydantic constraints), a default and a description: the field's
``description=``, else its attribute docstring (the string literal right after the field).
"""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

REQUIRED = "required"

# annotated_types constraint classes (what Field(gt=..) etc. put in FieldInfo.metadata).
_CONSTRAINTS = {"Gt": ">", "Ge": ">=", "Lt": "<", "Le": "<=", "MinLen": "min length",
                "MaxLen": "max length"}


@dataclass(frozen=True)
class Option:
    name: str
    type: str
    default: str
    description: str
    annotation: Any = None

    @property
    def required(self) -> bool:
        return self.default == REQUIRED


def model_options(model: type[BaseModel]) -> list[Option]:
    """One row per field of ``model``, in declaration order."""
    docstrings = attribute_docstrings(model)
    return [Option(name=name, type=field_type(field), default=field_default(field),
                   description=field.description or docstrings.get(name, ""),
                   annotation=field.annotation)
            for name, field in model.model_fields.items()]


def keyword_options(target: Any) -> list[Option]:
    """Rows for the keyword arguments of ``target``'s constructor (or the function itself)."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # unresolvable forward references: fall back to the raw strings
        hints = {}
    rows = []
    for parameter in signature.parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        annotation = hints.get(parameter.name, parameter.annotation)
        shown = "" if annotation is parameter.empty else type_name(annotation)
        default = (REQUIRED if parameter.default is parameter.empty
                   else render_value(parameter.default))
        rows.append(Option(parameter.name, shown, default, "", annotation))
    return rows


def accepts_any_keyword(target: Any) -> bool:
    """True when ``target`` takes ``**params`` (its options are not listed by its signature)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def config_model(target: Any) -> type[BaseModel] | None:
    """The component's nested pydantic ``Config``, or None (then its keywords are its options)."""
    model = getattr(target, "Config", None)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def field_type(field: FieldInfo) -> str:
    shown = type_name(field.annotation)
    constraints = [f"{_CONSTRAINTS[type(item).__name__]} {_constraint_value(item)}"
                   for item in field.metadata if type(item).__name__ in _CONSTRAINTS]
    pattern = next((getattr(item, "pattern", None) for item in field.metadata
                    if getattr(item, "pattern", None)), None)
    if pattern:
        constraints.append(f"matches {pattern}")
    return f"{shown} ({', '.join(constraints)})" if constraints else shown


def field_default(field: FieldInfo) -> str:
    if field.is_required():
        return REQUIRED
    if field.default_factory is not None:
        try:
            return render_value(field.default_factory())
        except TypeError:  # a factory that wants the validated data
            return "(computed)"
    return render_value(field.default)


def render_value(value: Any) -> str:
    """A default as it would be written in YAML/JSON (``null``, ``true``, ``[0.9, 0.95]``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", exclude_unset=True)
    if isinstance(value, tuple):
        value = list(value)
    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return repr(value)


def type_name(annotation: Any) -> str:
    """``int``, ``float | None``, ``"a" | "b"``, ``list[SourceConfig]``..."""
    if annotation is None or annotation is type(None):
        return "null"
    if isinstance(annotation, str):
        return annotation
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(arg) for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(arg) for arg in args)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        shown = [type_name(arg) for arg in args if arg is not Ellipsis]
        return f"{name}[{', '.join(shown)}]" if shown else name
    if annotation is typing.Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def model_types(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``list[X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        found.extend(m for m in model_types(arg) if m not in found)
    return found


def attribute_docstrings(model: type) -> dict[str, str]:
    """``{field: docstring}`` from the string literals written right after each field,
    base classes first so a subclass's own text wins."""
    found: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        if cls is object or cls is BaseModel or not issubclass(cls, BaseModel):
            continue
        found.update(_class_docstrings(cls))
    return found


def _class_docstrings(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    tree = ast.parse(source)
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    found = {}
    for statement, following in zip(body, body[1:]):
        if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)):
            found[statement.target.id] = " ".join(following.value.value.split())
    return found


def _constraint_value(item: Any) -> Any:
    for attribute in ("gt", "ge", "lt", "le", "min_length", "max_length"):
        if hasattr(item, attribute):
            return getattr(item, attribute)
    return "?"
