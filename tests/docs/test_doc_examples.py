"""Every command and code block of Getting started, Migrating from verl and Extending rlvr (and the
README's reward example) runs here: training commands as dry runs, Python examples for real."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from doc_blocks import REPO, Block, PageRunner, expect_lines, parse, with_dry_run


PAGES = ["docs/getting_started.md", "docs/migrating_from_verl.md", "docs/extending.md"]

INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def _gsm8k_from_verl_preprocessing(home: Path) -> None:
    """What the migration page starts from: the parquet files verl's GSM8K preprocessing writes to
    ``$HOME/data/gsm8k`` (its columns; two made-up questions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    questions = [("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
                 ("A box holds 6 eggs. How many eggs are in 2 boxes?", "6 * 2 = 12\n#### 12")]
    out = home / "data" / "gsm8k"
    out.mkdir(parents=True)
    for split in ("train", "test"):
        rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{q} {INSTRUCTION}"}],
                 "ability": "math", "reward_model": {"style": "rule", "ground_truth": a.split("#### ")[-1]},
                 "extra_info": {"split": split, "index": i, "answer": a, "question": q}}
                for i, (q, a) in enumerate(questions)]
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")


@pytest.mark.slow_on("docs/extending.md", "docs/getting_started.md")
@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page, tmp_path):
    if page.endswith("migrating_from_verl.md"):
        _gsm8k_from_verl_preprocessing(tmp_path)
    runner = PageRunner(tmp_path)
    blocks = parse(REPO / page)
    assert blocks, f"{page} has no code blocks"
    for block in blocks:
        runner.run(block)


def test_the_readme_reward_example_scores_and_passes_the_config_check(tmp_path):
    """The README's "your own reward" snippet: the function scores as the README says, and the
    command's config (with data files of its own) passes the check."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    code = text.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "my_reward.py").write_text(code)
    sys.path.insert(0, str(tmp_path))
    try:
        import my_reward
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("my_reward", None)
    assert my_reward.compute_score("gsm8k", "... so the answer is 12", "12") == 1.0
    assert my_reward.compute_score("gsm8k", "... so the answer is 13", "12") == 0.0
    command = next(line for line in text.splitlines() if "custom_reward_function.path=my_reward.py" in line)
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text("")
    runner = PageRunner(tmp_path)
    runner.run(Block("README.md", 0, "bash", "dry-run", "", command + "\n"))
    assert "rlvr: derived settings" in runner.last_output


# --- the harness itself ---------------------------------------------------------------------------

def test_a_block_without_a_marker_is_refused(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```bash\nrlvr --preset grpo\n```\n")
    with pytest.raises(ValueError, match=r"page.md:3: the code block has no"):
        parse(page)


def test_markers_kinds_arguments_and_text_are_read(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- test: file a/b.py -->\n```python\nx = 1\n```\n\n<!-- test: shell exit=2 -->\n\n"
                    "```bash\nfalse\n```\n")
    first, second = parse(page)
    assert (first.kind, first.arg, first.text, first.line) == ("file", "a/b.py", "x = 1\n", 2)
    assert (second.kind, second.arg, second.text, second.line) == ("shell", "exit=2", "false\n", 8)


def test_dry_run_goes_on_training_commands_only():
    text = ("python -m rlvr.data_prep.reasoning_gym --out data/arith  # the data\n"
            "rlvr --preset main_job \\\n    trainer.seed=2\n"
            "bash run.sh trainer.seed=3\n"
            "rlvr --preset grpo --dry-run\n")
    assert with_dry_run(text) == ("python -m rlvr.data_prep.reasoning_gym --out data/arith\n"
                                  "rlvr --preset main_job trainer.seed=2 --dry-run\n"
                                  "bash run.sh trainer.seed=3 --dry-run\n"
                                  "rlvr --preset grpo --dry-run\n")


def test_expected_output_lines_must_appear_in_order():
    actual = "rlvr: derived settings\n  algorithm   grpo advantages\n  per step    8 prompts\n"
    assert expect_lines("rlvr: derived settings\n...\nper step 8 prompts\n", actual) is None
    assert "'algorithm grpo'" in expect_lines("per step 8 prompts\nalgorithm grpo\n", actual)
    assert expect_lines("algorithm grpo\nadvantages\nper step\n", actual) is None  # a line shown wrapped
    assert "'grpo'" in expect_lines("advantages\ngrpo\n", actual)  # but never backwards


def test_a_failing_block_names_the_page_line_and_output(tmp_path):
    runner = PageRunner(tmp_path)
    with pytest.raises(AssertionError, match=r"p.md:7: exit status 3, expected 0(.|\n)*boom"):
        runner.run(Block("p.md", 7, "bash", "shell", "", "echo boom; exit 3\n"))
