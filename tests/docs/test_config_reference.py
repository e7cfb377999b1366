"""docs/config_reference.md is generated from the typed schema and must be current."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from typing import Any, Literal, Optional

from rlvr.trainer.config import help_config

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gen_config_reference", REPO / "scripts" / "gen_config_reference.py")
gen = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = gen  # dataclasses look their module up
_spec.loader.exec_module(gen)


def test_the_page_is_what_the_script_writes():
    page = (REPO / "docs" / "config_reference.md").read_text(encoding="utf-8")
    assert page == gen.render(), (
        "docs/config_reference.md is stale: the config schema changed. Regenerate it with "
        f"`{gen.REGENERATE}` (python scripts/gen_config_reference.py) and commit the page.")


def _rows() -> dict[str, list[str]]:
    """Full dotted key -> its table cells, read back from the rendered page."""
    rows, section = {}, None
    for line in gen.render().splitlines():
        if line.startswith("#") and not line.startswith("# "):
            section = line.lstrip("#").strip()
        elif line.startswith("| `") and section:
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            leaf = cells[0].strip("`")
            rows[leaf if section == gen.ROOT_HEADING else f"{section}.{leaf}"] = cells
    return rows


def test_every_key_of_help_config_has_a_row_with_its_help():
    listed = {match[1] for match in re.finditer(r"^  (\S+) = ", help_config(), re.MULTILINE)}
    rows = _rows()
    assert set(rows) == set(listed)
    assert rows["data.train_batch_size"] == ["`train_batch_size`", "int", "`8`",
                                             "prompts per training step (each sampled rollout.n times)", "same key"]


def test_verl_keys_are_marked_and_rlvr_keys_are_not():
    rows = _rows()
    assert rows["actor_rollout_ref.actor.ppo_mini_batch_size"][-1] == "same key"
    assert rows["trainer.user_modules"][-1] == "rlvr only"
    assert rows["async_training.lend_idle_cores"][-1] == "rlvr only"


def test_types_and_defaults_are_written_as_a_user_writes_them():
    assert gen.type_name(Optional[int]) == "int | None"
    assert gen.type_name(str | None) == "str | None"
    assert gen.type_name(Literal["exact", "contains"]) == "exact | contains"
    assert gen.type_name(Any) == "any"
    assert gen.type_name(list[str]) == "list"
    assert [gen.default_text(v) for v in (None, True, False, 0.5, "", "${a.b}", ["console", "jsonl"], {"k": 1})] == [
        "null", "true", "false", "0.5", '""', "${a.b}", "[console, jsonl]", "{k: 1}"]
    assert gen._cell("a | b") == "a \\| b"
    assert gen._code("`x`") == "`` `x` ``"


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "config_reference.md"
    stale.write_text("old\n")
    monkeypatch.setattr(gen, "PAGE", stale)
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "make docs-reference" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
