"""The stack machine that evaluates RPN."""

from __future__ import annotations

from stackcalc.parse import to_rpn, tokenize


class CalcError(ValueError):
    """A malformed expression or an undefined operation."""


def _apply(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        if b == 0:
            raise CalcError("division by zero")
        return a / b
    if op == "%":
        if b == 0:
            raise CalcError("modulo by zero")
        return a % b
    if op == "^":
        return a**b
    raise CalcError(f"unknown operator {op!r}")


def evaluate_rpn(tokens: list[str]) -> float:
    stack: list[float] = []
    for tok in tokens:
        if tok in "+-*/%^" and len(tok) == 1:
            if len(stack) < 2:
                raise CalcError(f"operator {tok!r} needs two operands")
            b = stack.pop()
            a = stack.pop()
            stack.append(_apply(tok, a, b))
        else:
            try:
                stack.append(float(tok))
            except ValueError:
                raise CalcError(f"not a number: {tok!r}") from None
    if len(stack) != 1:
        raise CalcError(f"malformed expression: {len(stack)} values left on the stack")
    return stack[0]


def evaluate(expr: str) -> float:
    """Evaluate an infix expression."""
    try:
        rpn = to_rpn(tokenize(expr))
    except ValueError as e:
        raise CalcError(str(e)) from None
    return evaluate_rpn(rpn)
