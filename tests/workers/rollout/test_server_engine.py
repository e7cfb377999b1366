"""The server rollout engine against stand-in servers (``fake_server.py``, standard library): the
engine protocol's output, load-based routing with prompt stickiness, the weight-sync sequence and its
stage times, weight versions per token, a stale replica refused, a dead replica's requests retried
elsewhere and the replica restarted with the current weights, a slow replica timed out, API keys,
the loopback rule, and servers given by URL. (The real vLLM server: ``test_vllm_server.py``.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from rlvr.protocol import DataProto
from rlvr.trainer.config.schema import RolloutConfig
from rlvr.utils.errors import ConfigError, StaleRolloutError
from rlvr.utils.net import free_port
from rlvr.utils.testing import tiny_causal_lm
from rlvr.utils.torch_functional import compute_position_ids
from rlvr.workers.rollout.server import SERVER_BACKENDS, ServerRollout, VLLMServerBackend
from rlvr.workers.rollout.server.http import Endpoint, ReplicaRequestError, ReplicaUnavailable, call_json
from rlvr.workers.rollout.server.router import NoReplicaError, ReplicaRouter
from rlvr.workers.rollout.server.vllm_backend import span_versions

FAKE = Path(__file__).with_name("fake_server.py")


class FakeBackend(VLLMServerBackend):
    """vLLM's routes and answers, served by ``fake_server.py``; ``replica_args[i]`` are extra
    arguments of replica ``i``."""

    replica_args: dict[int, list[str]] = {}
    record: Path | None = None

    def launch(self, spec, base_env):
        index = spec.seed - 1  # the engine seeds replica i with seed + i (seed 1 in these tests)
        command = [sys.executable, str(FAKE), "--host", spec.host, "--port", str(spec.port), "--record",
                   str(self.record), *self.replica_args.get(index, [])]
        if spec.api_key:
            command += ["--api-key", spec.api_key]
        return command, dict(base_env)


@pytest.fixture(scope="module", autouse=True)
def fake_backend():
    """The stand-in backend, registered for this module's tests only (registered at import, every
    worker process of the rest of the suite would import this module and the server engine's)."""
    SERVER_BACKENDS["fake_server"] = FakeBackend
    yield
    SERVER_BACKENDS.pop("fake_server", None)


@pytest.fixture(scope="module")
def tiny():
    return tiny_causal_lm(hidden_size=32, num_hidden_layers=1, seed=0)


def config(replicas: int = 2, **server) -> RolloutConfig:
    cfg = OmegaConf.structured(RolloutConfig)
    cfg.name, cfg.mode, cfg.response_length, cfg.prompt_length = "fake_server", "async", 8, 16
    cfg.server.num_replicas = replicas
    cfg.server.startup_timeout_s = 30.0
    for key, value in server.items():
        cfg.server[key] = value
    return cfg


@pytest.fixture
def engine_of(tiny, tmp_path):
    engines = []

    def make(replica_args=None, replicas: int = 2, **server):
        FakeBackend.replica_args = replica_args or {}
        FakeBackend.record = tmp_path / "requests.jsonl"
        model, tokenizer = tiny
        engine = ServerRollout(config(replicas, log_dir=str(tmp_path / "logs"), **server), model, tokenizer, "cpu",
                               seed=1, owns_module=True)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def requests(tmp_path: Path, path: str = "/inference/v1/generate") -> list[dict]:
    lines = (tmp_path / "requests.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["path"] == path]


def batch(prompts: list[list[int]], **meta) -> DataProto:
    width = max(map(len, prompts))
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = torch.tensor(p), 1
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask,
                                        "position_ids": compute_position_ids(mask)}, meta_info=meta)


def fake_tokens(prompt: list[int], seed: int, weights: int, count: int, stop: int | None) -> list[int]:
    """What ``fake_server.py`` answers (the independent reference of these tests)."""
    out = []
    for i in range(count):
        out.append((sum(prompt) + seed + weights + 7 * i) % 50 + 10)
        if out[-1] == stop:
            break
    return out


def norm_weights(model, value: float):
    """The model's parameters with ``model.norm.weight`` filled with ``value`` (the fake server's
    weights number is the rounded sum of that tensor)."""
    for name, param in model.named_parameters():
        yield name, torch.full_like(param, value) if name == "model.norm.weight" else param


def test_generates_the_protocol_output_routed_by_load_and_prompt(engine_of, tmp_path, tiny):
    engine = engine_of({0: ["--delay", "0.5"], 1: ["--delay", "0.5"]})  # requests overlap: load tells them apart
    prompts = [[5, 6, 7], [5, 6, 7], [9, 9], [9, 9], [11], [11]]
    eos = 12  # some rows end at this "EOS" id, the others run the full 8 tokens
    out = engine.generate_sequences(batch(prompts, eos_token_id=eos, pad_token_id=0))
    sent = requests(tmp_path)
    assert len(sent) == len(prompts)
    generator = torch.Generator().manual_seed(1)  # the engine's seed: one request seed per row, in row order
    seeds = [int(torch.randint(0, 2**31 - 1, (1,), generator=generator)) for _ in prompts]
    by_seed = {r["body"]["sampling_params"]["seed"]: r for r in sent}
    assert sorted(by_seed) == sorted(seeds)
    for row, (prompt, seed) in enumerate(zip(prompts, seeds)):
        expected = fake_tokens(prompt, seed, 0, 8, eos)
        n = len(expected)
        assert out.batch["responses"][row, :n].tolist() == expected and out.batch["responses"][row, n:].eq(0).all()
        assert out.batch["response_mask"][row].tolist() == [1] * n + [0] * (8 - n)
        torch.testing.assert_close(out.batch["rollout_log_probs"][row, :n], torch.tensor([-t / 100 for t in expected]))
        assert out.batch["response_versions"][row].tolist() == [0] * n + [-1] * (8 - n)
        assert by_seed[seed]["body"]["token_ids"] == prompt
        assert by_seed[seed]["body"]["sampling_params"]["stop_token_ids"] == [eos]
    assert out.meta_info["rollout_weights_version"] == 0 and out.meta_info["rollout_log_probs_exact"] is False
    port_of_prompt = {}
    for request in sent:
        port_of_prompt.setdefault(tuple(request["body"]["token_ids"]), set()).add(request["port"])
    assert all(len(ports) == 1 for ports in port_of_prompt.values())  # a prompt's samples share a replica
    assert len({p for ports in port_of_prompt.values() for p in ports}) == 2  # the load is spread over both
    assert set(torch.tensor(engine.router.served).tolist()) != {0}


def test_weight_sync_runs_every_stage_and_versions_follow(engine_of, tmp_path, tiny):
    engine = engine_of()
    model, _ = tiny
    stages = engine.update_weights(norm_weights(model, 2.0), 1)
    assert set(stages) == {"write", "pause", "reload", "reset_prefix_cache", "set_version", "resume", "sync"}
    assert all(seconds >= 0 for seconds in stages.values())
    calls = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for port in {c["port"] for c in calls}:  # each replica: the sequence, in order, after its start-up version
        paths = [c["path"] for c in calls if c["port"] == port]
        assert paths == ["/update_weight_version", "/pause", "/collective_rpc", "/reset_prefix_cache",
                         "/update_weight_version", "/resume"]
    assert [p.name for p in engine.weights.root.iterdir()] == ["weights-v1"]
    out = engine.generate_sequences(batch([[3, 4]]))
    seed = requests(tmp_path)[-1]["body"]["sampling_params"]["seed"]
    weights = 2 * model.model.norm.weight.numel()
    assert out.batch["responses"][0].tolist() == fake_tokens([3, 4], seed, weights, 8, None)
    assert out.batch["response_versions"][0].tolist() == [1] * 8


def test_a_replica_that_missed_the_sync_is_refused(engine_of, tiny):
    engine = engine_of({0: ["--ignore-versions"]}, replicas=1)
    engine.update_weights(tiny[0].named_parameters(), 1)
    with pytest.raises(StaleRolloutError, match=r"replica 0 .*sample 0 with weights version\(s\) \[0\].*version 1"):
        engine.generate_sequences(batch([[1, 2]]))


def test_dead_replica_requests_go_elsewhere_and_it_is_restarted_with_current_weights(engine_of, tmp_path, tiny):
    engine = engine_of({0: ["--die-after", "1"]})
    engine.update_weights(norm_weights(tiny[0], 3.0), 4)
    prompts = [[i, i + 1] for i in range(12)]
    out = engine.generate_sequences(batch(prompts))
    assert out.batch["response_mask"].sum(-1).eq(8).all()  # every sample was served
    assert (out.batch["response_versions"] == 4).all()
    assert engine.counts["retries"] >= 1
    deadline = time.time() + 60
    while not (engine.router.up[0] and engine.counts["restarts"] == 1) and time.time() < deadline:
        time.sleep(0.5)
    assert engine.counts["restarts"] == 1 and engine.router.up[0]
    restarted = engine.replicas[0].endpoint.url.rsplit(":", 1)[1]
    calls = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    after = [c for c in calls if str(c["port"]) == restarted][-5:]
    assert [c["path"] for c in after] == ["/pause", "/collective_rpc", "/reset_prefix_cache",
                                          "/update_weight_version", "/resume"]  # current weights before serving
    assert after[3]["body"] == {"new_version": "4"}


def test_a_slow_replica_times_out_and_every_failure_is_named(engine_of):
    engine = engine_of({0: ["--delay", "20"], 1: ["--delay", "20"]}, request_timeout_s=1.0, max_retries=1,
                       startup_timeout_s=2.0)
    with pytest.raises(ReplicaUnavailable) as err:
        engine.generate_sequences(batch([[1, 2]]))
    message = str(err.value)
    assert "stage 'generate' (sample 0)" in message and "no answer within 1 s" in message
    assert "replica 0" in message and "replica 1" in message


def test_api_key_is_required_and_sent(engine_of):
    engine = engine_of(api_key="s3cret", replicas=1)
    assert engine.generate_sequences(batch([[1, 2]])).batch["response_mask"].sum() == 8
    keyless = Endpoint("replica 0", engine.replicas[0].endpoint.url)
    with pytest.raises(ReplicaRequestError, match="HTTP 401"):
        call_json(keyless, "POST", "/pause", None, 5.0, "pause")


def test_managed_replicas_stay_on_loopback_key_or_not(tiny):
    model, tokenizer = tiny
    for key in (None, "k"):
        with pytest.raises(ConfigError, match="rollout.server.host.*0.0.0.0.*collective_rpc"):
            ServerRollout(config(1, host="0.0.0.0", api_key=key), model, tokenizer, "cpu", seed=1, owns_module=True)


def test_servers_given_by_url(tiny, tmp_path):
    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, str(FAKE), "--port", str(port), "--record",
                               str(tmp_path / "requests.jsonl")])
    try:
        model, tokenizer = tiny
        cfg = config(urls=[f"http://127.0.0.1:{port}"], weights_dir=str(tmp_path / "shared"))
        engine = ServerRollout(cfg, model, tokenizer, "cpu", seed=1, owns_module=True)
        try:
            engine.update_weights(norm_weights(model, 1.0), 2)
            out = engine.generate_sequences(batch([[1, 2]]))
            assert (out.batch["response_versions"] == 2).all()
            assert (tmp_path / "shared" / "weights-v2" / "model.safetensors").is_file()
        finally:
            engine.close()
        assert server.poll() is None  # a server the user runs is left running
    finally:
        server.kill()


def test_router_balances_load_and_keeps_sessions():
    router = ReplicaRouter(3)
    assert [router.acquire(s) for s in "abc"] == [0, 1, 2]
    assert router.acquire("a") == 0 and router.acquire("d") == 1  # sticky; then the least loaded, lowest index
    router.release(1)
    router.release(1)
    assert router.acquire("e") == 1
    router.mark_down(0)
    assert router.acquire("a") == 1  # its replica is down: the session moves (loads 1 and 1: lowest index)
    assert router.acquire("a") == 1 and router.in_flight == [2, 3, 1]
    with pytest.raises(NoReplicaError):
        router.acquire("y", exclude=[1, 2])


def test_span_versions():
    assert span_versions([{"version": "3", "start": 0, "end": 2}, {"version": "4", "start": 2, "end": 5}], 6) == \
        [3, 3, 4, 4, 4, -1]
    with pytest.raises(ValueError, match="not an integer"):
        span_versions([{"version": None, "start": 0, "end": 1}], 1)


def test_a_sessions_turns_stay_on_its_replica(engine_of, tmp_path):
    """Rows naming a session (a multi-turn trajectory's rounds, whose contexts grow) go to the replica
    of the session's first request, while new sessions go to the least-loaded replica."""
    engine = engine_of({0: ["--delay", "0.5"], 1: ["--delay", "0.5"]})  # the first requests overlap
    for turn in range(3):
        contexts = [[1] * (turn + 2), [2] * (turn + 2), [3] * (turn + 2), [4] * (turn + 2)]
        data = batch(contexts)
        data.non_tensor_batch["session_id"] = np.array(["a", "b", "c", "d"], dtype=object)
        engine.generate_sequences(data)
    port_of = {}
    for request in requests(tmp_path):
        port_of.setdefault(request["body"]["token_ids"][0], set()).add(request["port"])
    assert all(len(ports) == 1 for ports in port_of.values()) and len(set.union(*port_of.values())) == 2
