"""The agent settings are checked before anything starts; each error names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import write_tools_file

from rlvr.trainer.config import load_config, validate_config
from rlvr.utils.errors import ConfigError

LOOP = "actor_rollout_ref.rollout.agent.default_agent_loop"
MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.parametrize(("overrides", "key", "message"), [
    ([f"{LOOP}=nope"], LOOP, "'nope' is not valid.*use one of env_agent, single_turn, tool_agent"),
    ([f"{LOOP}=tool_agent"], f"{MT}.tool_config_path", "needs a YAML file of tools"),
    ([f"{LOOP}=tool_agent", f"{MT}.tool_config_path=/nonexistent/tools.yaml"], f"{MT}.tool_config_path", "is not a file"),
    ([f"{MT}.format=xml"], f"{MT}.format", "'xml' is not valid.*use one of hermes"),
    ([f"{LOOP}=env_agent"], f"{MT}.env_name", "the env_agent loop needs an environment.*retry"),
    ([f"{MT}.env_name=chess"], f"{MT}.env_name", "'chess' is not valid"),
    ([f"{MT}.max_assistant_turns=0"], f"{MT}.max_assistant_turns", "must be >= 1"),
    ([f"{MT}.max_tool_response_tokens=0"], f"{MT}.max_tool_response_tokens", "must be >= 1"),
    ([f"{MT}.max_parallel_calls=0"], f"{MT}.max_parallel_calls", "must be >= 1"),
    ([f"{MT}.tool_timeout_s=0"], f"{MT}.tool_timeout_s", "must be > 0"),
])
def test_bad_agent_settings_name_the_key(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate_config(load_config("grpo", overrides), require_data_files=False)
    assert err.value.key == key


def test_good_agent_settings_pass(tmp_path):
    tools = write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    validate_config(load_config("grpo", [f"{LOOP}=tool_agent", f"{MT}.tool_config_path={tools}"]),
                    require_data_files=False)
    validate_config(load_config("grpo", [f"{LOOP}=env_agent", f"{MT}.env_name=retry"]), require_data_files=False)


def test_a_relative_tools_file_is_made_absolute_when_the_config_is_loaded(tmp_path, monkeypatch):
    write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("grpo", [f"{LOOP}=tool_agent", f"{MT}.tool_config_path=tools.yaml"])
    path = Path(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path)
    assert path.is_absolute() and path.samefile(tmp_path / "tools.yaml")
    monkeypatch.chdir(tmp_path.parent)  # a worker elsewhere still finds it
    validate_config(cfg, require_data_files=False)
