"""The agent settings are checked before anything starts; each error names the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import write_tools_file

from rlvr.trainer.config import check_config, load_config, validate_config
from rlvr.utils.errors import ConfigError

LOOP = "actor_rollout_ref.rollout.agent.default_agent_loop"
MT = "actor_rollout_ref.rollout.multi_turn"


@pytest.mark.parametrize(("overrides", "key", "message"), [
    ([f"{LOOP}=nope"], LOOP, "'nope' is not valid.*use one of env_agent, openai_agent, single_turn, single_turn_agent, tool_agent"),
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


PYTHON_TOOL = "rlvr.agent.tools.python_interpreter.PythonInterpreterTool"
CALCULATOR = "rlvr.agent.tools.calculator.CalculatorTool"


@pytest.mark.parametrize(("config", "message"), [
    ("{python_executable: NOT_EXECUTABLE}", "config.python_executable: 'NOT_EXECUTABLE' is not an executable file"),
    ("{wall_timeout: 2}", "config: unknown key(s) ['wall_timeout']; use SandboxConfig fields: cpu_seconds"),
    ("{isolation: docker}", "config.isolation: must be 'auto', 'namespaces' or 'basic', got 'docker'"),
])
def test_a_python_tool_whose_sandbox_cannot_start_is_a_config_error(tmp_path, config, message):
    """The config check starts the sandbox of the python tool (not only when the rollout workers
    load the tools) and names the tools file, the entry and its setting."""
    not_executable = tmp_path / "python3"
    not_executable.write_text("")  # mode 0644
    config, message = (text.replace("NOT_EXECUTABLE", str(not_executable)) for text in (config, message))
    tools = write_tools_file(tmp_path / "tools.yaml", CALCULATOR, PYTHON_TOOL, configs={PYTHON_TOOL: config})
    with pytest.raises(ConfigError) as err:
        check_config(load_config("grpo", [f"{LOOP}=tool_agent", f"{MT}.tool_config_path={tools}"]),
                     require_data_files=False)
    assert err.value.key == f"{MT}.tool_config_path"
    assert err.value.message.startswith(f"tools[1] of {tools} (the python interpreter tool): {message}")


def test_a_python_tool_with_a_working_sandbox_passes_the_config_check(tmp_path):
    tools = write_tools_file(tmp_path / "tools.yaml", PYTHON_TOOL, configs={PYTHON_TOOL: "{wall_timeout_s: 5}"})
    check_config(load_config("grpo", [f"{LOOP}=tool_agent", f"{MT}.tool_config_path={tools}"]),
                 require_data_files=False)


def test_a_relative_tools_file_is_made_absolute_when_the_config_is_loaded(tmp_path, monkeypatch):
    write_tools_file(tmp_path / "tools.yaml", "rlvr.agent.tools.calculator.CalculatorTool")
    monkeypatch.chdir(tmp_path)
    cfg = load_config("grpo", [f"{LOOP}=tool_agent", f"{MT}.tool_config_path=tools.yaml"])
    path = Path(cfg.actor_rollout_ref.rollout.multi_turn.tool_config_path)
    assert path.is_absolute() and path.samefile(tmp_path / "tools.yaml")
    monkeypatch.chdir(tmp_path.parent)  # a worker elsewhere still finds it
    validate_config(cfg, require_data_files=False)
