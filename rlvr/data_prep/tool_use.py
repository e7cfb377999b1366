"""Data of the tool-use main job: three-digit multiplication, answered with a calculator tool.

The questions are reasoning-gym's ``products`` task with two three-digit factors, asked as "What is
361 * 220?" and scored by the task's own checker on the last line of the response
(``reasoning_gym/products``). A 135M model cannot multiply three-digit numbers in its head (0%
greedy without the tool); with the calculator it only has to call it with the right expression and
copy the result.

The prompt follows the function-calling format SmolLM2-Instruct was fine-tuned on: the system
message lists the tools as JSON inside ``<tools>...</tools>`` and asks for the calls as a JSON list
inside one tag, ``<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>`` (the ``hermes``
parser reads such lists). SmolLM2's chat template has no ``tools`` argument, so the schema is
written into the system message. With this prompt alone the untrained model still answers from its
head; ``--fewshot 1`` (the job's default) adds one worked conversation (question, call, tool result,
answer) as earlier chat turns, and then it calls the tool on a fair share of the questions, which
gives GRPO a signal to learn from.

Every row asks for the ``tool_agent`` loop (``agent_name``). ``<out>/tools.yaml`` is the tools file
of the job. The held-out set is drawn first and never occurs in training (see
:mod:`rlvr.data_prep.reasoning_gym`)::

    python -m rlvr.data_prep.tool_use --out data/tools
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rlvr.agent.tools.calculator import CalculatorTool, evaluate_expression
from rlvr.data_prep.reasoning_gym import PromptStyle, make_rows, split_entries
from rlvr.trainer.data import write_rows

TASK = "products"
CONFIG = {"min_terms": 2, "max_terms": 2, "min_digits": 3, "max_digits": 3}
TOOLS_YAML = "tools:\n  - class_name: rlvr.agent.tools.calculator.CalculatorTool\n    config: {}\n"


def call_text(expression: str) -> str:
    """A calculator call in SmolLM2's format: a JSON list of calls inside one tag."""
    call = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>[\n{json.dumps(call)}\n]</tool_call>"


def system_prompt() -> str:
    """The function-calling instructions with the calculator's schema (see the module docstring)."""
    schema = json.dumps([CalculatorTool.default_schema()["function"]])
    example = '{"name": "tool_name", "arguments": {"argument1": "value1"}}'
    return ("You are an expert in composing functions. You get a question and a set of functions, and you "
            "make the function calls that answer it.\n\n"
            f"You have access to the following tools:\n<tools>{schema}</tools>\n\n"
            "Write the calls in this format, with no other text:\n"
            f"<tool_call>[\n{example}\n]</tool_call>\n\n"
            "When you get the tool's result, answer with just the final number.")


def messages(text: str, shots: Sequence[dict]) -> list[dict[str, str]]:
    """System message, worked conversations for ``shots``, then the question."""
    out = [{"role": "system", "content": system_prompt()}]
    for shot in shots:
        expression = shot["metadata"]["expression"]
        out += [{"role": "user", "content": question(shot)},
                {"role": "assistant", "content": call_text(expression)},
                {"role": "tool", "content": evaluate_expression(expression)},
                {"role": "assistant", "content": str(shot["answer"])}]
    return out + [{"role": "user", "content": text}]


def question(entry: dict) -> str:
    """The question the model sees, "What is 361 * 220?" (reasoning-gym's own wording ends with "Give
    only the result as your final answer.", which makes the model answer without the tool)."""
    return f"What is {entry['metadata']['expression']}?"


def rows(entries: list[dict], shots: list[dict], split: str) -> list[dict]:
    """Rows for the ``tool_agent`` loop (reasoning-gym rows with the tool prompt)."""
    out = make_rows(TASK, entries, PromptStyle(), [], split)
    for row, entry in zip(out, entries):
        row["prompt"] = messages(question(entry), shots)
        row["extra_info"]["question"] = question(entry)
        row["agent_name"] = "tool_agent"
    return out


def build(out_dir: str | Path, train_size: int, test_size: int, seed: int, fewshot: int) -> tuple[Path, Path, Path]:
    """Write ``train.jsonl``, ``test.jsonl`` and ``tools.yaml`` into ``out_dir``; returns their paths."""
    shots, train_entries, test_entries = split_entries(TASK, train_size, test_size, seed, CONFIG, fewshot)
    out_dir = Path(out_dir)
    paths = out_dir / "train.jsonl", out_dir / "test.jsonl", out_dir / "tools.yaml"
    write_rows(rows(train_entries, shots, "train"), paths[0])
    write_rows(rows(test_entries, shots, "test"), paths[1])
    paths[2].write_text(TOOLS_YAML, encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train-size", type=int, default=2000, help="training prompts")
    parser.add_argument("--test-size", type=int, default=100, help="held-out prompts")
    parser.add_argument("--seed", type=int, default=0, help="generator seed (the held-out set and examples use others)")
    parser.add_argument("--fewshot", type=int, default=1, help="worked tool conversations before the question")
    args = parser.parse_args(argv)
    paths = build(args.out, args.train_size, args.test_size, args.seed, args.fewshot)
    print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
