"""Preprocessing: reasoning-gym tasks and GSM8K into the common RL format, scored by rlvr's scorers."""

from __future__ import annotations

import json
import re

import pytest

from rlvr.data_prep import gsm8k
from rlvr.data_prep import reasoning_gym as rg_prep
from rlvr.trainer.data import read_rows
from rlvr.reward.scorers import default_compute_score


def test_reasoning_gym_addition_rows_are_held_out_and_scorable(tmp_path):
    rg_prep.main(["--out", str(tmp_path), "--train-size", "50", "--test-size", "10"])
    train, test = read_rows(tmp_path / "train.jsonl"), read_rows(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (50, 10)
    assert not {r["extra_info"]["question"] for r in test} & {r["extra_info"]["question"] for r in train}
    row = test[0]
    assert row["data_source"] == "reasoning_gym/basic_arithmetic"
    question = row["extra_info"]["question"]
    a, b = question.removeprefix("Calculate ").rstrip(".").split(" + ")
    assert 1 <= int(a) <= 20 and 1 <= int(b) <= 20  # the main job's operand range
    assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
    instruction = "Write the calculation, then just the number on the last line."
    system, shot_q, shot_a, user = row["prompt"]
    assert system == {"role": "system", "content": "You are a careful calculator."}
    assert shot_q["role"] == "user" and shot_q["content"].endswith(instruction)
    x, y = shot_q["content"].removeprefix("Calculate ").split(".")[0].split(" + ")
    assert shot_a == {"role": "assistant", "content": f"{x} + {y} = {int(x) + int(y)}\n{int(x) + int(y)}"}
    assert user == {"role": "user", "content": f"{question} {instruction}"}
    assert all(r["prompt"][:3] == row["prompt"][:3] for r in train)  # one fixed worked example

    def score(response: str) -> dict:
        return default_compute_score(row["data_source"], response, row["reward_model"]["ground_truth"],
                                     row["extra_info"])

    truth = row["reward_model"]["ground_truth"]
    assert score(truth)["acc"] == 1.0
    assert score(f"{a} + {b} = {truth}\n{truth}")["acc"] == 1.0  # the worked-example format
    assert score(str(int(truth) + 1))["score"] == 0.0
    assert 0 < score(f"{a} + {b} = {truth}")["score"] < 1  # the checker's partial credit for extra text


def test_held_out_set_is_a_plain_sample_whatever_the_train_size(tmp_path):
    # the held-out set must not depend on the training set: with operands of one or two digits and
    # 2000 training items, nearly every one-digit sum is in the train set, and dropping those from the
    # test set (instead of from the train set) would leave it harder than the task
    task = {**rg_prep.ADDITION, "min_digits": 1}
    small = rg_prep.build("basic_arithmetic", tmp_path / "small", 50, 100, 0, task, rg_prep.ADDITION_STYLE)
    large = rg_prep.build("basic_arithmetic", tmp_path / "large", 2000, 100, 0, task, rg_prep.ADDITION_STYLE)
    small_test, large_test = read_rows(small[1]), read_rows(large[1])
    assert [r["extra_info"]["question"] for r in small_test] == [r["extra_info"]["question"] for r in large_test]
    train_questions = {r["extra_info"]["question"] for r in read_rows(large[0])}
    assert len(read_rows(large[0])) == 2000
    assert not train_questions & {r["extra_info"]["question"] for r in large_test}
    operands = [r["extra_info"]["question"].removeprefix("Calculate ").rstrip(".").split(" + ") for r in large_test]
    one_digit = sum(min(int(a), int(b)) < 10 for a, b in operands) / len(operands)
    assert one_digit >= 0.5  # 47 and 20 of the 100 held-out sums have two and one one-digit operands


def test_operand_range_keeps_only_questions_inside_it_with_a_distinct_held_out_set(tmp_path):
    train_path, test_path = rg_prep.build("basic_arithmetic", tmp_path, 300, 100, 0, rg_prep.ADDITION,
                                          rg_prep.ADDITION_STYLE, operands=(1, 20))
    train, test = read_rows(train_path), read_rows(test_path)
    numbers = [rg_prep.numbers_in(r["extra_info"]) for r in train + test]
    assert all(len(pair) == 2 and all(1 <= n <= 20 for n in pair) for pair in numbers)
    test_questions = [r["extra_info"]["question"] for r in test]
    assert len(set(test_questions)) == len(test_questions) == 100  # 400 possible sums: no repeats kept
    assert not set(test_questions) & {r["extra_info"]["question"] for r in train}
    # the filter draws from the whole operand range, not just its low end
    assert max(max(pair) for pair in numbers) == 20 and min(min(pair) for pair in numbers) == 1


def test_operand_range_that_no_question_fits_says_what_to_change(tmp_path):
    with pytest.raises(ValueError, match=r"have all numbers in \[200, 300\].*widen --operands"):
        rg_prep.build("basic_arithmetic", tmp_path, 4, 2, 0, rg_prep.ADDITION, operands=(200, 300))
    # too few distinct questions in the range for the held-out set (one-digit operands 0-10 drawn)
    one_digit = {**rg_prep.ADDITION, "min_digits": 1, "max_digits": 1}
    with pytest.raises(ValueError, match="gave 9 held-out"):
        rg_prep.build("basic_arithmetic", tmp_path, 4, 10, 0, one_digit, operands=(1, 3))


def test_reasoning_gym_other_task_and_parquet(tmp_path):
    rg_prep.main(["--task", "chain_sum", "--config", '{"max_digits": 1}', "--out", str(tmp_path),
                  "--train-size", "8", "--test-size", "4", "--seed", "3", "--format", "parquet"])
    rows = read_rows(tmp_path / "test.parquet")
    assert len(rows) == 4 and rows[0]["data_source"] == "reasoning_gym/chain_sum"
    assert rows[0]["prompt"] == [{"role": "user", "content": rows[0]["extra_info"]["question"]}]
    truth = rows[0]["reward_model"]["ground_truth"]
    assert default_compute_score(rows[0]["data_source"], truth, truth, rows[0]["extra_info"])["acc"] == 1.0


def test_gsm8k_from_local_files(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    record = {"question": "Tom has 1,200 apples and buys 3. How many?", "answer": "1200 + 3 = 1203\n#### 1,203"}
    for split in ("train", "test"):
        (src / f"{split}.jsonl").write_text(json.dumps(record) + "\n")
    gsm8k.main(["--local-dir", str(src), "--out", str(tmp_path / "out"), "--format", "jsonl"])
    row = read_rows(tmp_path / "out" / "test.jsonl")[0]
    assert row["reward_model"]["ground_truth"] == "1203"
    assert row["data_source"] == "openai/gsm8k"
    assert row["prompt"][0]["content"].startswith("Tom has 1,200 apples") and '"####"' in row["prompt"][0]["content"]
    assert default_compute_score("openai/gsm8k", "so #### 1203", "1203", row["extra_info"]) == 1.0
    with pytest.raises(ValueError, match="without '####'"):
        gsm8k.extract_solution("no marker")


def test_tool_use_rows_show_the_tool_in_smollm2_format_and_hold_out_the_test_set(tmp_path):
    from rlvr.agent.tool_parser import ToolCall, get_tool_parser
    from rlvr.agent.tools import load_tools
    from rlvr.data_prep import tool_use

    train, test, tools = tool_use.build(tmp_path, train_size=30, test_size=10, seed=0, fewshot=1)
    train_rows, test_rows = read_rows(str(train)), read_rows(str(test))
    assert (len(train_rows), len(test_rows)) == (30, 10)
    assert list(load_tools(tools)) == ["calculator"]
    row = test_rows[0]
    system, shot_question, shot_call, shot_result, shot_answer, question = row["prompt"]
    assert '<tools>[{"name": "calculator"' in system["content"] and "<tool_call>[" in system["content"]
    a, b = (int(x) for x in row["extra_info"]["metadata"]["expression"].split(" * "))
    assert question == {"role": "user", "content": f"What is {a} * {b}?"} and row["agent_name"] == "tool_agent"
    expression = shot_question["content"][len("What is "):-1]
    assert get_tool_parser("hermes").parse(shot_call["content"]).calls == [ToolCall("calculator", {"expression": expression})]
    x, y = (int(v) for v in expression.split(" * "))
    assert shot_result == {"role": "tool", "content": str(x * y)} and shot_answer["content"] == str(x * y)
    assert row["reward_model"]["ground_truth"] == str(a * b)
    scored = default_compute_score(row["data_source"], f"<tool_call>...</tool_call>\n{a * b}",
                                   row["reward_model"]["ground_truth"], row["extra_info"])
    assert scored["acc"] == 1.0
    held_out = {r["extra_info"]["metadata"]["expression"] for r in test_rows} | {expression}
    assert not held_out & {r["extra_info"]["metadata"]["expression"] for r in train_rows}


def test_mixed_domains_rows_carry_checkable_ground_truths(tmp_path):
    from rlvr.data_prep import mixed
    from rlvr.reward.scorers.code import build_task
    from rlvr.reward.scorers.ifeval import evaluate, parse_ground_truth

    train, test = mixed.build(tmp_path, train_size=30, test_size=6, seed=3)
    rows = read_rows(train)
    assert [r["data_source"] for r in rows[:6]] == ["math", "ifeval", "code"] * 2
    assert len(read_rows(test)) == 6 and read_rows(test)[0]["prompt"] != rows[0]["prompt"]
    solutions = {"doubled": "x * 2", "squared": "x * x", "plus": "x + {k}", "remainder": "x % {k}"}
    for row in rows:
        question, truth = row["prompt"][0]["content"], row["reward_model"]["ground_truth"]
        if row["data_source"] == "math":
            a, b = map(int, question.removeprefix("What is ").split("?")[0].split(" + "))
            assert truth == str(a + b) and "\\boxed{}" in question
        elif row["data_source"] == "ifeval":
            ids, kwargs = parse_ground_truth(truth)
            assert all(evaluate("the sea is calm", ids, kwargs).strict)  # a compliant answer passes
        else:
            word = next(w for w in solutions if w in question)
            k = re.search(r"(?:plus|by) (\d)", question)
            body = solutions[word].format(k=k.group(1) if k else "")
            task = build_task(f"def f(x):\n    return {body}\n", truth)
            namespace: dict = {}
            exec(task.jobs[0].code, namespace)  # noqa: S102 - our generated asserts against a known-correct f
