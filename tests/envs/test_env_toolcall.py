"""The tool-call format: well-formed calls in both syntaxes, and every malformed case."""

from __future__ import annotations

import pytest

from envs.tiny import TinyEnv
from envs.toolcall import ToolCallError, coding_tools, parse_tool_call, strip_thinking

TOOLS = coding_tools(allow_shell=False)
SHELL_TOOLS = coding_tools(allow_shell=True)


def test_xml_edit_block_values_keep_indentation() -> None:
    reply = ("I will fix it.\n<tool>edit</tool>\n<path> calc/core.py </path>\n<old>\n    return a - b\n</old>\n"
             "<new>\n    return a + b\n</new>\nDone.")
    call = parse_tool_call(reply, TOOLS)
    assert call.name == "edit"
    assert dict(call.args) == {"path": "calc/core.py", "old": "    return a - b", "new": "    return a + b"}
    assert call.ignored_calls == 0


def test_block_value_keeps_inner_newlines_and_empty_new() -> None:
    call = parse_tool_call("<tool>edit</tool><path>a.py</path><old>x = 1\n\ny = 2\n</old><new></new>", TOOLS)
    assert call.args["old"] == "x = 1\n\ny = 2"
    assert call.args["new"] == ""


def test_arguments_in_any_order_and_optional_ones() -> None:
    call = parse_tool_call("<tool>view</tool><lines>3-9</lines><path>src/m.py</path>", TOOLS)
    assert dict(call.args) == {"lines": "3-9", "path": "src/m.py"}
    assert dict(parse_tool_call("<tool>run_tests</tool>", TOOLS).args) == {}
    assert parse_tool_call("<tool> submit </tool>", TOOLS).name == "submit"


def test_only_first_call_runs_and_extra_calls_are_counted() -> None:
    reply = "<tool>view</tool><path>a</path>\n<tool>view</tool><path>b</path>\n<tool>submit</tool>"
    call = parse_tool_call(reply, TOOLS)
    assert call.args["path"] == "a"
    assert call.ignored_calls == 2


def test_tags_inside_a_value_do_not_end_the_call() -> None:
    reply = "<tool>write</tool><path>t.html</path><content>\n<tool>x</tool><b>bold</b>\n</content>"
    call = parse_tool_call(reply, TOOLS)
    assert call.args["content"] == "<tool>x</tool><b>bold</b>"
    assert call.ignored_calls == 0


def test_prose_tags_are_skipped() -> None:
    call = parse_tool_call("<b>Plan</b> <tool>view</tool> <i>the file</i> <path>x.py</path>", TOOLS)
    assert dict(call.args) == {"path": "x.py"}


def test_thinking_is_ignored_and_unclosed_thinking_is_an_error() -> None:
    reply = "<think>maybe <tool>submit</tool>?</think>\n<tool>view</tool><path>a.py</path>"
    assert parse_tool_call(reply, TOOLS).name == "view"
    with pytest.raises(ToolCallError, match="ended inside <think>"):
        parse_tool_call("<think>I wonder <tool>view</tool>", TOOLS)
    assert strip_thinking("a</think>b") == "ab"


def test_json_tool_call_qwen_style() -> None:
    reply = '<tool_call>\n{"name": "edit", "arguments": {"path": "a.py", "old": "x", "new": "y"}}\n</tool_call>'
    call = parse_tool_call(reply, TOOLS)
    assert (call.name, dict(call.args)) == ("edit", {"path": "a.py", "old": "x", "new": "y"})
    # arguments as a JSON string, numbers converted, no closing tag
    call = parse_tool_call('<tool_call>{"name": "view", "arguments": "{\\"path\\": \\"a\\", \\"lines\\": 5}"}', TOOLS)
    assert dict(call.args) == {"path": "a", "lines": "5"}
    assert parse_tool_call('<tool_call>{"name": "submit"}</tool_call><tool>view</tool>', TOOLS).ignored_calls == 1


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("", "your reply is empty"),
        ("I think the bug is in line 3.", "no tool call found"),
        ("<tool>view", "<tool> is not closed"),
        ("<tool>frobnicate</tool>", "unknown tool 'frobnicate'; the tools are: view, edit, write, run_tests, submit"),
        ("<tool></tool>", "unknown tool an empty name"),
        ("<tool>shell</tool><cmd>ls</cmd>", "unknown tool 'shell'"),
        ("<tool>view</tool>", "missing argument(s) path: add <path>...</path>"),
        ("<tool>edit</tool><path>a</path><old>x", "<old> is not closed: end the value with </old>"),
        ("<tool>edit</tool><path>a</path><path>b</path><old>x</old><new>y</new>", "given twice"),
        ("<tool_call>{name: view}</tool_call>", "the JSON inside <tool_call> is invalid"),
        ('<tool_call>["view"]</tool_call>', "must hold a JSON object"),
        ('<tool_call>{"name": "view", "arguments": {"path": "a", "colour": "red"}}</tool_call>',
         "has no argument 'colour'"),
        ('<tool_call>{"name": "view", "arguments": {"path": ["a"]}}</tool_call>', "must be a string"),
        ('<tool_call>{"name": "view", "arguments": "nope"}</tool_call>', "not a JSON object"),
    ],
)
def test_malformed_calls_give_clear_observations(reply: str, message: str) -> None:
    with pytest.raises(ToolCallError) as err:
        parse_tool_call(reply, TOOLS)
    text = str(err.value)
    assert text.startswith("Error: ")
    assert message in text
    assert "Reply with exactly one tool call, for example:\n<tool>view</tool>" in text


def test_shell_only_where_allowed() -> None:
    assert parse_tool_call("<tool>shell</tool><cmd>\nls -la\n</cmd>", SHELL_TOOLS).args["cmd"] == "ls -la"
    assert "shell" not in TOOLS.names and "shell" in SHELL_TOOLS.names


def test_oversized_argument_refused() -> None:
    with pytest.raises(ToolCallError, match="characters"):
        parse_tool_call("<tool>write</tool><path>a</path><content>" + "x" * 200_001 + "</content>", TOOLS)


def test_tool_docs_list_every_tool_and_argument() -> None:
    doc = TOOLS.describe()
    for name in TOOLS.names:
        assert f"- {name}:" in doc
    assert "<old>...</old> (required)" in doc and "<lines>...</lines> (optional)" in doc


def test_free_text_toolset_takes_the_whole_reply() -> None:
    tools = TinyEnv().tools
    call = parse_tool_call("<think>hm</think>  apple  ", tools)
    assert (call.name, dict(call.args)) == ("answer", {"text": "apple"})
