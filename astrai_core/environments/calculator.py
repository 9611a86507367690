"""A ``calculator`` tool for the ``tools`` environment: exact integer and decimal arithmetic.

``environment: {name: tools, tools: ["astrai_core.environments.calculator:calculator"]}``.
The expression is parsed with :mod:`ast` and only numbers, ``+ - * / // %``, unary signs
and parentheses are evaluated (never ``eval``): a model cannot run code through it, and
exponents, names and calls are refused with an error the model sees.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPRESSION = 200


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % and parentheses, exactly.

    Returns the value as text: an integer when the result is whole, else a decimal
    rounded to 6 places.
    """
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"expression longer than {MAX_EXPRESSION} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    if value.denominator == 1:
        return str(value.numerator)
    return f"{float(value):.6f}".rstrip("0").rstrip(".")


def _evaluate(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if right == 0 and type(node.op) in (ast.Div, ast.FloorDiv, ast.Mod):
            raise ZeroDivisionError("division by zero")
        return Fraction(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    raise ValueError(f"unsupported in an arithmetic expression: {ast.dump(node)[:40]}")
