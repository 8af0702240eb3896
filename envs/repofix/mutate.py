"""Bug injection by AST mutation, deterministic and minimal in the source text.

A *site* is one place in a project's source (tests excluded) where one mutation operator applies.
``find_sites`` lists every site of a file in source order; ``apply_mutation`` rewrites only the
source span of the mutated node (``lineno/col_offset .. end_lineno/end_col_offset``, UTF-8 byte
offsets as the ``ast`` module reports them) with ``ast.unparse`` of the mutated node, so the rest
of the file (comments, formatting) is untouched and the bug is a one-expression diff, like a
real one-line bug. The result must compile.

Operators (each the classic mutation-testing operator of that name):

- ``compare_flip``: ``<`` <-> ``<=``, ``>`` <-> ``>=``, ``==`` <-> ``!=``, ``is`` <-> ``is not``,
  ``in`` <-> ``not in`` (one comparison operator of a chain).
- ``off_by_one``: an integer literal ``c`` (not a bool, not inside an f-string) -> ``c + 1`` and
  ``c - 1`` (two sites).
- ``operator_swap``: ``+`` <-> ``-``, ``*`` <-> ``/``, ``//`` -> ``/``, ``%`` -> ``//``,
  ``**`` -> ``*`` in binary operations and augmented assignments; ``and`` <-> ``or``;
  ``min`` <-> ``max`` calls.

Which site becomes a task is chosen by a seeded ``random.Random`` (``envs.repofix.tasks``); a
mutant no test detects (an *equivalent mutant*) is discarded there by running the tests.
"""

from __future__ import annotations

import ast
import copy
from dataclasses import dataclass
from pathlib import Path

_COMPARE_SWAP: dict[type[ast.cmpop], type[ast.cmpop]] = {
    ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq, ast.Is: ast.IsNot, ast.IsNot: ast.Is, ast.In: ast.NotIn, ast.NotIn: ast.In,
}
_BINOP_SWAP: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Div, ast.Div: ast.Mult, ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv, ast.Pow: ast.Mult,
}
_BOOL_SWAP: dict[type[ast.boolop], type[ast.boolop]] = {ast.And: ast.Or, ast.Or: ast.And}
_CALL_SWAP = {"min": "max", "max": "min"}

#: The nodes that carry a source span (``lineno`` .. ``end_col_offset``) and that mutations rewrite.
_Located = ast.expr | ast.stmt


class MutationError(ValueError):
    """A mutation does not apply to the given source (stale site or non-compiling result)."""


@dataclass(frozen=True, slots=True)
class Mutation:
    """One injected bug: ``original`` (the node's source span) becomes ``replacement``."""

    file: str  # path relative to the project root, posix
    line: int  # 1-based
    col: int  # 0-based byte offset
    end_line: int
    end_col: int
    kind: str  # compare_flip | off_by_one | operator_swap
    original: str
    replacement: str

    def describe(self) -> str:
        return f"{self.file}:{self.line}: {self.kind}: {self.original!r} -> {self.replacement!r}"


_SYMBOL: dict[type[ast.AST], str] = {
    ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=", ast.Is: "is",
    ast.IsNot: "is not", ast.In: "in", ast.NotIn: "not in", ast.Add: "+", ast.Sub: "-", ast.Mult: "*",
    ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**", ast.And: "and", ast.Or: "or",
}


class _Source:
    """Byte offsets of (line, col) positions, as the ``ast`` module reports them."""

    def __init__(self, source: str) -> None:
        self.data = source.encode()
        self.starts = [0]
        for line in self.data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))

    def start(self, node: _Located) -> int:
        return self.starts[node.lineno - 1] + node.col_offset

    def end(self, node: _Located) -> int:
        if node.end_lineno is None or node.end_col_offset is None:  # only on nodes not made by ast.parse
            raise MutationError(f"{type(node).__name__} node at line {node.lineno} has no end position")
        return self.starts[node.end_lineno - 1] + node.end_col_offset

    def text(self, a: int, b: int) -> str:
        return self.data[a:b].decode()


def _swap_in_gap(src: _Source, node: _Located, left: ast.expr, right: ast.expr, old: str, new: str) -> str | None:
    """The node's source with operator ``old`` (between ``left`` and ``right``) replaced by ``new``.

    Keeps the original formatting; None when the gap holds more than the operator, parentheses and
    whitespace (a comment, a line continuation): the caller then falls back to ``ast.unparse``.
    """
    a, b = src.end(left), src.start(right)
    gap = src.text(a, b)
    core = " ".join(gap.strip(" \t\n()").split())
    if core != old:
        return None
    i = gap.index(gap.strip(" \t\n()")[:1]) if core else -1
    j = i + len(gap.strip(" \t\n()"))
    new_gap = gap[:i] + new + gap[j:]
    return src.text(src.start(node), a) + new_gap + src.text(b, src.end(node))


def _in_fstring(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    cur = parents.get(node)
    while cur is not None:
        if isinstance(cur, ast.JoinedStr):
            return True
        cur = parents.get(cur)
    return False


def _variants(node: ast.AST, parents: dict[ast.AST, ast.AST], src: _Source) -> list[tuple[str, str]]:
    """(kind, replacement source) for every mutation of ``node`` itself."""
    out: list[tuple[str, str]] = []
    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        for i, op in enumerate(node.ops):
            swap = _COMPARE_SWAP.get(type(op))
            if swap is None:
                continue
            text = _swap_in_gap(src, node, operands[i], operands[i + 1], _SYMBOL[type(op)], _SYMBOL[swap])
            if text is None:
                new = copy.deepcopy(node)
                new.ops[i] = swap()
                text = ast.unparse(new)
            out.append(("compare_flip", text))
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        swap_op = _BINOP_SWAP.get(type(node.op))
        if swap_op is not None:
            old_s, new_s = _SYMBOL[type(node.op)], _SYMBOL[swap_op]
            left: ast.expr
            right: ast.expr
            if isinstance(node, ast.AugAssign):
                old_s, new_s, left, right = old_s + "=", new_s + "=", node.target, node.value
            else:
                left, right = node.left, node.right
            text = _swap_in_gap(src, node, left, right, old_s, new_s)
            if text is None:
                new_b = copy.deepcopy(node)
                new_b.op = swap_op()
                text = ast.unparse(new_b)
            out.append(("operator_swap", text))
    elif isinstance(node, ast.BoolOp):
        old_s = _SYMBOL[type(node.op)]
        new_op = _BOOL_SWAP[type(node.op)]
        pieces = [src.text(src.start(node), src.start(node.values[0]))]
        ok = True
        for k, v in enumerate(node.values):
            pieces.append(src.text(src.start(v), src.end(v)))
            if k + 1 < len(node.values):
                gap = src.text(src.end(v), src.start(node.values[k + 1]))
                if " ".join(gap.strip(" \t\n()").split()) != old_s:
                    ok = False
                pieces.append(gap.replace(old_s, _SYMBOL[new_op], 1))
        pieces.append(src.text(src.end(node.values[-1]), src.end(node)))
        if ok:
            out.append(("operator_swap", "".join(pieces)))
        else:
            new_bool = copy.deepcopy(node)
            new_bool.op = new_op()
            out.append(("operator_swap", ast.unparse(new_bool)))
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALL_SWAP:
        text = src.text(src.start(node), src.end(node))
        out.append(("operator_swap", _CALL_SWAP[node.func.id] + text[len(node.func.id):]))
    elif (isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**6
          and not _in_fstring(node, parents)):
        for delta in (1, -1):
            out.append(("off_by_one", repr(node.value + delta)))
    return out


def find_sites(rel: str, source: str) -> list[Mutation]:
    """Every mutation of ``source`` (file ``rel``), in source order."""
    tree = ast.parse(source)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    src = _Source(source)
    sites: list[Mutation] = []
    for node in ast.walk(tree):
        # only expressions and statements can be mutated (nodes like ``arg`` / ``keyword`` have spans
        # too, but no operator applies to them)
        if not isinstance(node, ast.expr | ast.stmt) or node.end_lineno is None or node.end_col_offset is None:
            continue
        original = src.text(src.start(node), src.end(node))
        for kind, replacement in _variants(node, parents, src):
            if replacement == original:
                continue
            sites.append(Mutation(rel, node.lineno, node.col_offset, node.end_lineno, node.end_col_offset, kind,
                                  original, replacement))
    sites.sort(key=lambda m: (m.line, m.col, m.end_line, m.end_col, m.kind, m.replacement))
    return sites


def apply_mutation(source: str, m: Mutation) -> str:
    """``source`` with ``m`` applied; raises ``MutationError`` if the span does not match."""
    lines = source.encode().splitlines(keepends=True)
    if m.end_line > len(lines):
        raise MutationError(f"{m.describe()}: the file has only {len(lines)} lines")
    start = sum(len(x) for x in lines[: m.line - 1]) + m.col
    end = sum(len(x) for x in lines[: m.end_line - 1]) + m.end_col
    data = source.encode()
    if data[start:end].decode(errors="replace") != m.original:
        raise MutationError(f"{m.describe()}: the source at that span is {data[start:end]!r}")
    out = (data[:start] + m.replacement.encode() + data[end:]).decode()
    try:
        compile(out, m.file, "exec")
    except SyntaxError as e:
        raise MutationError(f"{m.describe()}: the mutant does not compile ({e.msg})") from None
    return out


def source_files(project_dir: Path) -> list[str]:
    """The project's mutable source files (package modules; tests and ``__init__`` excluded)."""
    out = []
    for p in sorted(project_dir.rglob("*.py")):
        rel = p.relative_to(project_dir).as_posix()
        if rel.startswith("tests/") or p.name == "__init__.py" or "__pycache__" in rel:
            continue
        out.append(rel)
    return out


def project_sites(project_dir: Path) -> list[Mutation]:
    sites: list[Mutation] = []
    for rel in source_files(project_dir):
        sites.extend(find_sites(rel, (project_dir / rel).read_text()))
    return sites


def revert_mutation(mutated: str, m: Mutation) -> str:
    """The inverse of ``apply_mutation``: the reference fix of the injected bug."""
    data = mutated.encode()
    starts = [0]
    for line in data.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    start = starts[m.line - 1] + m.col
    rep = m.replacement.encode()
    if data[start:start + len(rep)] != rep:
        raise MutationError(f"{m.describe()}: the mutant text is not at line {m.line} column {m.col}")
    return (data[:start] + m.original.encode() + data[start + len(rep):]).decode()
