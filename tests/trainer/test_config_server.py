"""Config checks of rollout through servers (``rollout.mode``, ``rollout.server``) and of the
OpenAI-compatible endpoint (``rollout.agent.openai``): each wrong setting is refused before anything
starts, naming the key; binding off loopback without an API key is refused."""

from __future__ import annotations

import pytest

from rlvr.trainer.config import check_config, load_config
from rlvr.utils.errors import ConfigError

SERVER = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.mode=async"]
PYTHON = ["actor_rollout_ref.rollout.server.python=python3"]  # the trainer's venv may lack vLLM


def check(*overrides: str) -> None:
    check_config(load_config("grpo", list(overrides)), require_data_files=False)


@pytest.mark.parametrize(("overrides", "key", "says"), [
    (["actor_rollout_ref.rollout.mode=server"], "rollout.mode", "not a rollout mode"),
    (["actor_rollout_ref.rollout.mode=async"], "rollout.mode", "no backend"),
    ([*SERVER, *PYTHON, "actor_rollout_ref.rollout.server.host=0.0.0.0"], "rollout.server.host", "collective_rpc"),
    ([*SERVER, *PYTHON, "actor_rollout_ref.rollout.server.host=0.0.0.0", "actor_rollout_ref.rollout.server.api_key=k"],
     "rollout.server.host", "does not guard"),
    ([*SERVER, "actor_rollout_ref.rollout.server.urls=[http://10.0.0.5:8000]"], "rollout.server.weights_dir",
     "every server can read"),
    ([*SERVER, "actor_rollout_ref.rollout.server.urls=[10.0.0.5:8000]",
      "actor_rollout_ref.rollout.server.weights_dir=/tmp/w"], "rollout.server.urls", "http://host:port"),
    ([*SERVER, *PYTHON, "actor_rollout_ref.rollout.server.num_replicas=2",
      "actor_rollout_ref.rollout.server.cpu_binds=[1]"], "rollout.server.cpu_binds", "one per replica"),
    ([*SERVER, "actor_rollout_ref.rollout.server.python=/no/such/python"], "rollout.server.python",
     "not an executable"),
    ([*SERVER, *PYTHON, "actor_rollout_ref.rollout.server.request_timeout_s=0"],
     "rollout.server.request_timeout_s", "> 0"),
    (["actor_rollout_ref.rollout.agent.openai.host=0.0.0.0"], "rollout.agent.openai.api_key", "0.0.0.0"),
    (["actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent"], "rollout.agent.openai.run",
     r"run\(client, row\)"),
    (["actor_rollout_ref.rollout.agent.openai.max_request_bytes=10"], "rollout.agent.openai.max_request_bytes",
     ">= 1024"),
])
def test_bad_server_and_endpoint_settings_are_refused(overrides, key, says):
    with pytest.raises(ConfigError, match=says) as err:
        check(*overrides)
    assert err.value.key == f"actor_rollout_ref.{key}"


def test_good_server_settings_pass():
    check(*SERVER, *PYTHON, "actor_rollout_ref.rollout.server.num_replicas=2",
          "actor_rollout_ref.rollout.server.cpu_binds=[0,1]")
    check(*SERVER, "actor_rollout_ref.rollout.server.urls=[http://10.0.0.5:8000]",
          "actor_rollout_ref.rollout.server.weights_dir=/shared/w", "actor_rollout_ref.rollout.server.api_key=k")
    check("actor_rollout_ref.rollout.agent.openai.host=0.0.0.0", "actor_rollout_ref.rollout.agent.openai.api_key=k")
    check("actor_rollout_ref.rollout.agent.default_agent_loop=openai_agent",
          "actor_rollout_ref.rollout.agent.openai.run=examples/openai_agent.py:run")
