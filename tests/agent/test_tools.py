"""Tools: the calculator, the sandboxed Python interpreter, the YAML loader, the tool-call parser
and the timeout runner."""

from __future__ import annotations

import threading
import time

import pytest
from agent_helpers import CountingTool, write_tools_file

from rlvr.agent.tool_parser import ToolCall, get_tool_parser
from rlvr.agent.tools import BaseTool, ToolArgumentError, ToolResponse, load_tools, tools_from_specs
from rlvr.agent.tools.calculator import CalculatorTool, evaluate_expression
from rlvr.agent.tools.executor import run_with_timeout
from rlvr.agent.tools.python_interpreter import PythonInterpreterTool

CALCULATOR = "rlvr.agent.tools.calculator.CalculatorTool"


@pytest.mark.parametrize(("expression", "value"), [
    ("123 * 456", "56088"), ("(2 + 3) * -4", "-20"), ("7 / 2", "3.5"), ("7 // 2", "3"), ("2 ** 10", "1024"),
    ("10 % 4", "2"), ("3 × 4 ÷ 2", "6"), ("2^8", "256"), ("1.5 * 4", "6"), ("  12*3 = ", "36"), ("1 / 3", "0.333333333333"),
])
def test_calculator_values(expression, value):
    assert evaluate_expression(expression) == value


@pytest.mark.parametrize(("expression", "message"), [
    ("__import__('os').system('true')", "unsupported element"), ("abs(-3)", "unsupported element"),
    ("x + 1", "unsupported element"), ("'a' * 3", "unsupported element"), ("(1).real", "unsupported element"),
    ("1 / 0", "division by zero"), ("5 % 0", "division by zero"), ("9 ** 9 ** 9", "exponents larger"),
    ("99999 ** 99", "more than 100 digits"), ("10.0 ** 99 * 10.0 ** 99", "more than 100 digits"),
    ("1 +", "cannot parse"), ("", "empty"), ("1+" * 150 + "1", "longer than 200"), ("(-8) ** 0.5", "not a real"),
    ("0 ** -1", "division by zero"),
])
def test_calculator_rejects_with_a_message_for_the_model(expression, message):
    start = time.perf_counter()
    with pytest.raises(ToolArgumentError, match=message):
        evaluate_expression(expression)
    assert time.perf_counter() - start < 1.0


def test_calculator_tool_schema_and_missing_argument():
    tool = CalculatorTool()
    schema = tool.get_openai_tool_schema()
    assert tool.name == "calculator" and schema["type"] == "function"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    instance = tool.create()
    assert tool.execute(instance, {"expression": "6*7"}) == (ToolResponse("42"), 0.0, {})
    with pytest.raises(ToolArgumentError, match="needs the argument"):
        tool.execute(instance, {"expr": "6*7"})
    assert tool.calc_reward(instance) == 0.0 and tool.release(instance) is None


def test_python_tool_runs_in_the_sandbox_with_its_limits():
    tool = PythonInterpreterTool({"wall_timeout_s": 2, "cpu_seconds": 2})
    assert tool.name == "python"
    response, reward, metrics = tool.execute("x", {"code": "print(sum(range(10)))"})
    assert response.text.strip() == "45" and reward == 0.0 and metrics["sandbox_status"] == "ok"
    failed, _, metrics = tool.execute("x", {"code": "raise ValueError('boom')"})
    assert "ValueError: boom" in failed.text and metrics["sandbox_status"] == "runtime_error"
    looped, _, metrics = tool.execute("x", {"code": "while True: pass"})
    assert metrics["sandbox_status"] in ("timeout", "killed") and "Error: the program" in looped.text
    silent, _, _ = tool.execute("x", {"code": "y = 1"})
    assert "printed nothing" in silent.text
    with pytest.raises(ValueError, match="unknown key"):
        PythonInterpreterTool({"wall_timeout": 2})


def test_tools_file_builds_the_tools(tmp_path):
    path = write_tools_file(tmp_path / "tools.yaml", CALCULATOR)
    tools = load_tools(path)
    assert list(tools) == ["calculator"] and isinstance(tools["calculator"], CalculatorTool)
    schema = {"type": "function", "function": {"name": "calc", "description": "d",
                                               "parameters": {"type": "object", "properties": {}, "required": []}}}
    renamed = tools_from_specs([{"class_name": CALCULATOR, "tool_schema": schema}])
    assert list(renamed) == ["calc"]


@pytest.mark.parametrize(("specs", "message"), [
    ([], "non-empty list"),
    ([{"config": {}}], "needs a class_name"),
    ([{"class_name": "CalculatorTool"}], "full import path"),
    ([{"class_name": "rlvr.agent.tools.nope.Tool"}], "cannot import"),
    ([{"class_name": "rlvr.protocol.DataProto"}], "not a subclass"),
    ([{"class_name": CALCULATOR}, {"class_name": CALCULATOR}], "a second tool named 'calculator'"),
    ([{"class_name": CALCULATOR, "kwargs": {}}], "unknown key"),
    ([{"class_name": CALCULATOR, "tool_schema": {"type": "function"}}], "tool_schema must look like"),
])
def test_bad_tool_specs_are_named(specs, message):
    with pytest.raises(ValueError, match=message):
        tools_from_specs(specs)


def test_bad_tools_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_tools(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("- just a list\n")
    with pytest.raises(ValueError, match="'tools' list"):
        load_tools(tmp_path / "bad.yaml")


def test_hermes_parser_reads_calls_and_reports_malformed_ones():
    parser = get_tool_parser("hermes")
    assert parser.stop == ["</tool_call>"]
    turn = parser.parse('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n'
                        '</tool_call><tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>')
    assert turn.calls == [ToolCall("calculator", {"expression": "2*3"}), ToolCall("python", {"code": "print(1)"})]
    assert turn.errors == [] and turn.content.strip() == "Let me compute." and turn.wants_tools
    plain = parser.parse("The answer is 6.")
    assert not plain.wants_tools and plain.content == "The answer is 6."
    cases = {'<tool_call>{"name": calculator}</tool_call>': "not valid JSON",
             '<tool_call>{"arguments": {}}</tool_call>': 'with a "name"',
             '<tool_call>["calculator"]</tool_call>': 'with a "name"',
             '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>': '"arguments" must be a JSON object',
             '<tool_call>{"name": "calculator", "arguments": "nope"}</tool_call>': '"arguments" must be a JSON object',
             '<tool_call>{"name": "calculator", "arguments": {}}': "not closed"}
    for text, message in cases.items():
        broken = parser.parse(text)
        assert broken.calls == [] and len(broken.errors) == 1 and message in broken.errors[0], (text, broken.errors)
        assert broken.wants_tools


def test_hermes_parser_reads_a_json_list_of_calls_in_one_tag():
    parser = get_tool_parser("hermes")
    turn = parser.parse('<tool_call>[\n{"name": "calculator", "arguments": {"expression": "625 * 958"}},\n'
                        '{"name": "python", "arguments": {"code": "print(2)"}}\n]</tool_call>')
    assert turn.calls == [ToolCall("calculator", {"expression": "625 * 958"}), ToolCall("python", {"code": "print(2)"})]
    assert turn.errors == [] and turn.content == "" and turn.wants_tools
    empty = parser.parse("<tool_call>[]</tool_call>")  # SmolLM2's "no call needed"
    assert empty.calls == [] and empty.errors == [] and not empty.wants_tools
    mixed = parser.parse('<tool_call>[{"name": "calculator", "arguments": {"expression": "1+1"}}, {"args": 1}]</tool_call>')
    assert mixed.calls == [] and len(mixed.errors) == 1 and 'with a "name"' in mixed.errors[0] and mixed.wants_tools


def test_unknown_parser_lists_the_valid_names():
    with pytest.raises(KeyError, match="valid names: hermes"):
        get_tool_parser("nope")


def test_run_with_timeout_bounds_hung_and_failing_calls():
    release = threading.Event()

    def hang():
        release.wait(30)
        return "late"

    def fail():
        raise RuntimeError("broken tool")

    start = time.perf_counter()
    outcomes = run_with_timeout([lambda: 7, hang, fail], timeout_s=0.5)
    assert time.perf_counter() - start < 2.0
    assert [o.status for o in outcomes] == ["ok", "timeout", "error"]
    assert outcomes[0].value == 7 and outcomes[1].value is None and outcomes[1].seconds == 0.5
    assert isinstance(outcomes[2].error, RuntimeError)
    release.set()


def test_base_tool_needs_a_schema_and_execute():
    with pytest.raises(TypeError, match="abstract"):
        BaseTool()  # type: ignore[abstract]
    counter = CountingTool()
    first = counter.create()
    assert counter.create("given") == "given" and first != counter.create()
    assert counter.execute(first, {})[0].text == "1" and counter.calc_reward(first) == 1.0
