"""The README and the documentation pages keep the shape users rely on: a short README that answers
the first questions, the same headline numbers on the README and the site's home page, every
built-in name documented on its page, and titles in the project's own terms."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from rlvr.reward.config import RewardWorkersConfig
from rlvr.trainer.config.builtin_names import BUILTIN_NAMES

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
README = (REPO / "README.md").read_text(encoding="utf-8")
HOME = (DOCS / "index.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section."""
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def _site_links(text: str) -> str:
    """README links (relative to the repository) as the site writes them (relative to docs/)."""
    return re.sub(r"\]\(docs/", "](", text)


def test_the_readme_is_short_and_answers_the_first_questions_in_order():
    lines = README.splitlines()
    assert len(lines) <= 120
    headings = [line[3:] for line in lines if line.startswith("## ")]
    assert headings[:4] == ["Run it", "Run your verl script", "Add your own reward", "The numbers"]
    assert "make train" in _section(README, "Run it") and "make test" in _section(README, "Run it")
    assert "python3 -m rlvr.trainer.main_ppo" in _section(README, "Run your verl script")
    assert "custom_reward_function.path=" in _section(README, "Add your own reward")
    intro = README[:README.index("\n## ")]
    assert "[the numbers](#the-numbers)" in intro  # the numbers are pointed to from the first paragraph


def test_the_headline_table_has_the_seven_results_each_linked_to_its_measurement():
    rows = [line for line in _section(README, "The numbers").splitlines() if line.startswith("| ")][1:]
    assert [row.split(" | ")[0].lstrip("| ").split(",")[0].split(" (")[0] for row in rows] == [
        "main job", "tool job", "vision job", "reward-model job", "distillation job", "CPU against TRL 1.16",
        "GPU against TRL 1.16"]
    for row in rows:
        assert re.search(r"\]\(docs/[\w/]+\.md(#[\w-]+)?\)", row), row


@pytest.mark.parametrize("title", ["The numbers", "What it does"])
def test_the_home_page_shows_the_readme_numbers_and_features(title):
    assert _section(HOME, title) == _site_links(_section(README, title))


@pytest.mark.parametrize("key, page", [
    ("algorithm.adv_estimator", "algorithms.md"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode", "algorithms.md"),
    ("reward_model.reward_manager", "rewards.md"),
    ("actor_rollout_ref.rollout.name", "rollout.md"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop", "agents.md"),
])
def test_every_built_in_name_is_on_its_page(key, page):
    text = (DOCS / page).read_text(encoding="utf-8")
    missing = [name for name in BUILTIN_NAMES[key] if f"`{name}`" not in text]
    assert not missing, f"docs/{page} does not mention the built-in {key} value(s) {missing}"


def test_every_reward_worker_is_on_the_rewards_page():
    workers = [field.name for field in dataclasses.fields(RewardWorkersConfig)]  # reward.workers.<name>
    text = (DOCS / "rewards.md").read_text(encoding="utf-8")
    missing = [name for name in workers if f"`{name}`" not in text]
    assert not missing, f"docs/rewards.md does not describe the reward worker(s) {missing}"


def test_no_title_cites_a_work_item_number():
    cited = [f"{path.relative_to(REPO)}: {line}" for path in [REPO / "README.md", *DOCS.rglob("*.md")]
             for line in path.read_text(encoding="utf-8").splitlines()
             if line.startswith("#") and re.search(r"\bissue\s*#?\d+|\(#\d+\)", line, re.IGNORECASE)]
    assert not cited, "say what the section is about instead of the work item that asked for it:\n" + "\n".join(cited)


def test_every_heading_and_deviation_starts_its_own_block():
    """A heading or a ``**Dn.`` entry right under a table row or a paragraph is swallowed by it
    (a merge that joins two sections without a blank line); every one has a blank line before it."""
    joined = []
    for path in [REPO / "README.md", *DOCS.rglob("*.md")]:
        lines, fenced = path.read_text(encoding="utf-8").splitlines(), False
        for number, line in enumerate(lines[1:], start=2):
            fenced = fenced != lines[number - 2].startswith("```")
            if not fenced and line.startswith(("#", "**D")) and lines[number - 2].strip() \
                    and not lines[number - 2].startswith("#"):
                joined.append(f"{path.relative_to(REPO)}:{number}: {line[:60]}")
    assert joined == []
