"""The tool-call format: how the policy's reply text becomes one ``ToolCall``, and its parser.

Format (chosen so that a 135M-parameter model can emit it: no quoting, no escaping, no JSON)::

    <tool>edit</tool>
    <path>calc/core.py</path>
    <old>
        return a - b
    </old>
    <new>
        return a + b
    </new>

- ``<tool>NAME</tool>`` opens a call; each argument is ``<ARG>value</ARG>``, in any order.
- Values are verbatim (multi-line, indentation kept). For *block* arguments (file content, old /
  new text, commands) exactly one newline right after the opening tag and one right before the
  closing tag are dropped, so a value may sit on its own lines. *Inline* arguments (paths, line
  ranges) are stripped of surrounding whitespace.
- Text outside the tags (reasoning, prose) is ignored, as are ``<think>...</think>`` blocks (Qwen3).
  Tags that are not arguments of the tool (e.g. ``<b>``) are skipped.
- One action per reply: only the first call runs; the observation says how many were ignored.
- The Qwen / Hermes JSON form is accepted too, since Qwen3 models are trained on it::

      <tool_call>{"name": "view", "arguments": {"path": "calc/core.py"}}</tool_call>

  (``arguments`` may also be a JSON-encoded string; non-string scalars are converted with ``str``.)

A value cannot contain its own closing tag (``</new>`` inside ``<new>``); that limit is documented
to the model by the tool docs. Every malformed reply raises ``ToolCallError`` whose message is the
observation for the model: what was wrong, and a correct example.

Environments declare their tools as a ``ToolSet``; ``coding_tools()`` gives the standard set
(view / edit / write / run_tests / submit, and shell where the sandbox confines it). A ``ToolSet``
with ``free_text_tool`` set (the tiny environment) takes the whole reply as that tool's ``text``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MAX_ARG_CHARS = 200_000  # one argument; a larger value is refused (a runaway generation, not an edit)


class ToolCallError(ValueError):
    """A reply could not be turned into a valid tool call; ``str(err)`` is the observation text."""


@dataclass(frozen=True, slots=True)
class ArgSpec:
    name: str
    doc: str
    required: bool = True
    block: bool = False  # multi-line value: keep inner whitespace, drop one edge newline each side


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    doc: str
    args: tuple[ArgSpec, ...] = ()
    example: str = ""

    def arg(self, name: str) -> ArgSpec | None:
        return next((a for a in self.args if a.name == name), None)

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.args)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One parsed action. ``ignored_calls``: further calls in the same reply that were not run."""

    name: str
    args: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    ignored_calls: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", MappingProxyType(dict(self.args)))


@dataclass(frozen=True, slots=True)
class ToolSet:
    tools: tuple[ToolSpec, ...]
    free_text_tool: str | None = None  # if set: the whole reply is ToolCall(free_text_tool, {"text": reply})

    def __post_init__(self) -> None:
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"ToolSet: duplicate tool names in {names}")
        if self.free_text_tool is not None and self.free_text_tool not in names:
            raise ValueError(f"ToolSet: free_text_tool={self.free_text_tool!r} is not one of {names}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    def get(self, name: str) -> ToolSpec | None:
        return next((t for t in self.tools if t.name == name), None)

    def example(self) -> str:
        for t in self.tools:
            if t.example:
                return t.example
        return f"<tool>{self.tools[0].name}</tool>"

    def describe(self) -> str:
        """The tool documentation for the system prompt."""
        if self.free_text_tool is not None:
            return "Reply with plain text; your whole reply is your answer."
        lines = [
            "Act by replying with exactly one tool call in this format:",
            "<tool>NAME</tool>",
            "<ARG>value</ARG>",
            "Values are taken verbatim and may span several lines; a value cannot contain its own "
            "closing tag. Only the first tool call of a reply is run. Tools:",
        ]
        for t in self.tools:
            lines.append(f"- {t.name}: {t.doc}")
            for a in t.args:
                req = "required" if a.required else "optional"
                lines.append(f"    <{a.name}>...</{a.name}> ({req}) {a.doc}")
            if t.example:
                lines.append("  Example:\n" + "\n".join("    " + x for x in t.example.splitlines()))
        return "\n".join(lines)


# --------------------------------------------------------------------------- the standard tools
VIEW = ToolSpec(
    "view",
    "show a file with line numbers, or list a directory.",
    (ArgSpec("path", "path relative to the repository root ('.' for the root)"),
     ArgSpec("lines", "line range START-END, e.g. 10-40", required=False)),
    "<tool>view</tool>\n<path>src/module.py</path>",
)
EDIT = ToolSpec(
    "edit",
    "replace text in a file: <old> must occur exactly once in the file and is replaced by <new>.",
    (ArgSpec("path", "file to edit"),
     ArgSpec("old", "exact text to replace, including indentation", block=True),
     ArgSpec("new", "replacement text (may be empty)", block=True)),
    "<tool>edit</tool>\n<path>src/module.py</path>\n<old>\n    return a - b\n</old>\n<new>\n    return a + b\n</new>",
)
WRITE = ToolSpec(
    "write",
    "create or overwrite a whole file.",
    (ArgSpec("path", "file to write"), ArgSpec("content", "the complete new file content", block=True)),
)
RUN_TESTS = ToolSpec(
    "run_tests",
    "run the project's tests and show the results.",
    (ArgSpec("target", "optional subset: a test file or test id", required=False),),
    "<tool>run_tests</tool>",
)
SHELL = ToolSpec(
    "shell",
    "run a shell command in the repository root (time and output limited).",
    (ArgSpec("cmd", "the command line", block=True),),
    "<tool>shell</tool>\n<cmd>grep -rn 'def parse' .</cmd>",
)
SUBMIT = ToolSpec("submit", "finish: your changes are graded by the hidden tests. Takes no arguments.",
                  (), "<tool>submit</tool>")


def coding_tools(allow_shell: bool) -> ToolSet:
    """view / edit / write / run_tests / submit, plus shell when ``allow_shell``."""
    tools = (VIEW, EDIT, WRITE, RUN_TESTS, *((SHELL,) if allow_shell else ()), SUBMIT)
    return ToolSet(tools)


# ------------------------------------------------------------------------------------- parsing
_THINK_RE = re.compile(r"<think>.*?</think>", re.S)
_TAG_RE = re.compile(r"<([A-Za-z_][\w-]*)>")
_OPEN_RE = re.compile(r"<tool>|<tool_call>")


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks; a reply that ends inside one has no action."""
    text = _THINK_RE.sub("", text)
    if "<think>" in text:
        raise ToolCallError(
            "Error: your reply ended inside <think> without a tool call (it was cut off). "
            "Think briefly, then give the tool call."
        )
    return text.replace("</think>", "")


def _hint(tools: ToolSet) -> str:
    return "Reply with exactly one tool call, for example:\n" + tools.example()


def _fail(problem: str, tools: ToolSet) -> ToolCallError:
    return ToolCallError(f"Error: {problem}\n{_hint(tools)}")


def _normalise(spec: ArgSpec, value: str) -> str:
    if not spec.block:
        return value.strip()
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value


def _validate(spec: ToolSpec, args: dict[str, str], tools: ToolSet, ignored: int) -> ToolCall:
    missing = [a.name for a in spec.args if a.required and a.name not in args]
    if missing:
        need = " ".join(f"<{m}>...</{m}>" for m in missing)
        raise _fail(f"tool {spec.name!r} is missing argument(s) {', '.join(missing)}: add {need}", tools)
    for k, v in args.items():
        if len(v) > MAX_ARG_CHARS:
            raise _fail(f"argument {k!r} of {spec.name!r} has {len(v)} characters (limit {MAX_ARG_CHARS})", tools)
    return ToolCall(spec.name, args, ignored)


def _unknown_tool(name: str, tools: ToolSet) -> ToolCallError:
    shown = repr(name) if name else "an empty name"
    return _fail(f"unknown tool {shown}; the tools are: {', '.join(tools.names)}", tools)


def _parse_xml(text: str, start: int, tools: ToolSet) -> ToolCall:
    name_start = start + len("<tool>")
    name_end = text.find("</tool>", name_start)
    if name_end < 0:
        raise _fail("<tool> is not closed: write the tool name as <tool>NAME</tool>", tools)
    name = text[name_start:name_end].strip()
    spec = tools.get(name)
    if spec is None:
        raise _unknown_tool(name, tools)
    args: dict[str, str] = {}
    pos = name_end + len("</tool>")
    while True:
        m = _TAG_RE.search(text, pos)
        if m is None:
            break
        tag = m.group(1)
        if tag in ("tool", "tool_call"):
            pos = m.start()
            break
        arg = spec.arg(tag)
        if arg is None:  # prose markup, or an argument of another tool: skip the tag itself
            pos = m.end()
            continue
        close = text.find(f"</{tag}>", m.end())
        if close < 0:
            raise _fail(f"<{tag}> is not closed: end the value with </{tag}>", tools)
        if tag in args:
            raise _fail(f"argument <{tag}> is given twice in one call", tools)
        args[tag] = _normalise(arg, text[m.end():close])
        pos = close + len(f"</{tag}>")
    ignored = len(_OPEN_RE.findall(text, pos))
    return _validate(spec, args, tools, ignored)


def _parse_json(text: str, start: int, tools: ToolSet) -> ToolCall:
    body_start = start + len("<tool_call>")
    close = text.find("</tool_call>", body_start)
    body = text[body_start:] if close < 0 else text[body_start:close]
    rest = "" if close < 0 else text[close + len("</tool_call>"):]
    try:
        obj = json.loads(body.strip())
    except json.JSONDecodeError as e:
        raise _fail(f"the JSON inside <tool_call> is invalid ({e.msg} at line {e.lineno} column {e.colno})",
                    tools) from None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise _fail('<tool_call> must hold a JSON object {"name": ..., "arguments": {...}}', tools)
    spec = tools.get(obj["name"])
    if spec is None:
        raise _unknown_tool(obj["name"], tools)
    raw = obj.get("arguments", obj.get("parameters", obj.get("args", {})))
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError:
            raise _fail(f"the arguments of {spec.name!r} are a string that is not a JSON object", tools) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(f"the arguments of {spec.name!r} must be a JSON object", tools)
    args: dict[str, str] = {}
    for k, v in raw.items():
        if spec.arg(k) is None:
            allowed = ", ".join(spec.arg_names) or "none"
            raise _fail(f"tool {spec.name!r} has no argument {k!r} (arguments: {allowed})", tools)
        if isinstance(v, dict | list):
            raise _fail(f"argument {k!r} of {spec.name!r} must be a string, not a JSON {type(v).__name__}", tools)
        args[k] = v if isinstance(v, str) else str(v)
    return _validate(spec, args, tools, len(_OPEN_RE.findall(rest)))


def parse_tool_call(reply: str, tools: ToolSet) -> ToolCall:
    """Parse the first tool call of ``reply`` against ``tools``; raises ``ToolCallError``."""
    text = strip_thinking(reply)
    if tools.free_text_tool is not None:
        return ToolCall(tools.free_text_tool, {"text": text.strip()})
    m = _OPEN_RE.search(text)
    if m is None:
        if not text.strip():
            raise _fail("your reply is empty", tools)
        raise _fail("no tool call found in your reply", tools)
    if m.group(0) == "<tool>":
        return _parse_xml(text, m.start(), tools)
    return _parse_json(text, m.start(), tools)
