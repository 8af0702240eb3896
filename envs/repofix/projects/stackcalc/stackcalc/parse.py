"""Tokenizer and shunting-yard conversion to reverse Polish notation."""

from __future__ import annotations

PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "%": 2, "^": 3}
RIGHT_ASSOC = {"^"}


def tokenize(expr: str) -> list[str]:
    """Numbers (integers or decimals), operators and parentheses; spaces are ignored."""
    tokens: list[str] = []
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch.isspace():
            i += 1
        elif ch.isdigit() or ch == ".":
            j = i
            while j < len(expr) and (expr[j].isdigit() or expr[j] == "."):
                j += 1
            tokens.append(expr[i:j])
            i = j
        elif ch in PRECEDENCE or ch in "()":
            tokens.append(ch)
            i += 1
        else:
            raise ValueError(f"unexpected character {ch!r} at position {i}")
    return tokens


def to_rpn(tokens: list[str]) -> list[str]:
    """Shunting-yard: infix tokens to RPN."""
    out: list[str] = []
    ops: list[str] = []
    for tok in tokens:
        if tok in PRECEDENCE:
            while ops and ops[-1] in PRECEDENCE:
                top = ops[-1]
                if PRECEDENCE[top] > PRECEDENCE[tok] or (
                    PRECEDENCE[top] == PRECEDENCE[tok] and tok not in RIGHT_ASSOC
                ):
                    out.append(ops.pop())
                else:
                    break
            ops.append(tok)
        elif tok == "(":
            ops.append(tok)
        elif tok == ")":
            while ops and ops[-1] != "(":
                out.append(ops.pop())
            if not ops:
                raise ValueError("unbalanced ')'")
            ops.pop()
        else:
            out.append(tok)
    while ops:
        op = ops.pop()
        if op == "(":
            raise ValueError("unbalanced '('")
        out.append(op)
    return out
