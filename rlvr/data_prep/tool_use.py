"""Data of the tool-use main job: three-digit multiplication, answered with a calculator tool.

The questions are reasoning-gym's ``products`` task with two three-digit factors ("Solve the
following multiplication: 361 * 220. Give only the result as your final answer."), scored by the
task's own checker on the last line of the response (``reasoning_gym/products``). A 135M model
cannot multiply three-digit numbers in its head (about 0% greedy without the tool); with the
calculator it only has to call it with the right expression and copy the result.

Every row asks for the ``tool_agent`` loop (``agent_name``). The system message describes the
calculator from its OpenAI schema and the call format (SmolLM2's chat template has no ``tools``
argument, so the description is plain text); ``--fewshot 1`` adds a worked conversation (question,
call, tool result, answer) as earlier chat turns. ``<out>/tools.yaml`` is the tools file of the job.
The held-out set is drawn first and never occurs in training (see :mod:`rlvr.data_prep.reasoning_gym`)::

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
    """A Hermes-style calculator call."""
    arguments = {"name": "calculator", "arguments": {"expression": expression}}
    return f"<tool_call>\n{json.dumps(arguments)}\n</tool_call>"


def system_prompt() -> str:
    """The calculator's description and the call format, from the tool's schema."""
    function = CalculatorTool.default_schema()["function"]
    return (f"You are a helpful assistant with one tool: {function['name']}(expression) - "
            f"{function['description'][0].lower()}{function['description'][1:]} To use it, write\n"
            f"{call_text('2 * 3')}\nand wait for the result. Give the final answer as just the number "
            "on the last line.")


def messages(question: str, shots: Sequence[dict]) -> list[dict[str, str]]:
    """System message, worked conversations for ``shots``, then the question."""
    out = [{"role": "system", "content": system_prompt()}]
    for shot in shots:
        expression = shot["metadata"]["expression"]
        out += [{"role": "user", "content": shot["question"]},
                {"role": "assistant", "content": call_text(expression)},
                {"role": "tool", "content": evaluate_expression(expression)},
                {"role": "assistant", "content": str(shot["answer"])}]
    return out + [{"role": "user", "content": question}]


def rows(entries: list[dict], shots: list[dict], split: str) -> list[dict]:
    """Rows for the ``tool_agent`` loop (reasoning-gym rows with the tool prompt)."""
    out = make_rows(TASK, entries, PromptStyle(), [], split)
    for row, entry in zip(out, entries):
        row["prompt"] = messages(entry["question"], shots)
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
    parser.add_argument("--fewshot", type=int, default=0, help="worked tool conversations before the question")
    args = parser.parse_args(argv)
    paths = build(args.out, args.train_size, args.test_size, args.seed, args.fewshot)
    print("wrote " + ", ".join(str(p) for p in paths))


if __name__ == "__main__":
    main()
