"""The server rollout engine (``rollout.mode=async``): generation through inference-server replicas.

The replicas are server processes that rlvr starts and supervises (``rollout.server.num_replicas``,
each with its port, CPU cores or GPUs, log file) or servers the user runs
(``rollout.server.urls``). The engine keeps the rollout-engine protocol of
:mod:`rlvr.workers.rollout.base` (same output keys, masks, EOS and stop handling as the in-process
engines) and adds ``response_versions [B, R]``: the weights version that sampled each response
token (-1 where ``response_mask`` is 0), from the spans the server reports.

- **Requests**: one token-in/token-out request per sample, at most
  ``server.max_concurrent_requests`` in flight, each with its own seed drawn from the engine's
  generator (a retried request samples the same tokens). Routing
  (:class:`~rlvr.workers.rollout.server.router.ReplicaRouter`): the least-loaded replica, the same
  one for every request of a session (a multi-turn trajectory's ``session_id``, else the prompt).
- **Failures**: every call has a time limit; a request that fails is sent to another replica (up to
  ``server.max_retries`` times) and the error names replica, stage and sample. A managed replica
  that died is restarted by the engine's supervisor thread and loads the current weights before it
  serves again (``server.max_restarts``).
- **Weights**: :meth:`ServerRollout.update_weights` writes the weights once as a versioned
  Hugging Face folder (:class:`~rlvr.workers.rollout.server.weights.WeightsFolder`) and runs the
  backend's reload sequence on every replica at once; it returns the seconds of each stage.
- **Versions**: every sampled token must carry the version the engine last pushed; a token from
  another version means a replica missed the sync, and the call is refused
  (:class:`~rlvr.utils.errors.StaleRolloutError`, naming replica and sample).
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from torch import nn
from transformers import PreTrainedTokenizerBase

from rlvr.protocol import DataProto
from rlvr.utils.errors import StaleRolloutError
from rlvr.utils.net import free_port, require_loopback_for_dev_mode
from rlvr.workers.rollout.base import SESSION_KEY, CallSettings, Weights, call_settings, response_tensors
from rlvr.workers.rollout.server.backend import Completion, LaunchSpec, get_server_backend
from rlvr.workers.rollout.server.http import ReplicaError, ReplicaUnavailable, call_json
from rlvr.workers.rollout.server.replica import ExternalReplica, ManagedReplica
from rlvr.workers.rollout.server.router import NoReplicaError, ReplicaRouter
from rlvr.workers.rollout.server.weights import WeightsFolder, write_checkpoint
from rlvr.workers.rollout.vllm_weights import PolicyWeightNames, refuse_moe_reload_on_cpu

__all__ = ["ServerRollout"]

SUPERVISE_INTERVAL_S = 2.0


class ServerRollout:
    """Generation through server replicas (see the module docstring).

    Args:
        config: the ``rollout`` section (sampling, lengths, engine options, ``server``).
        module: the policy model (its config, parameter names and LoRA scale; the weights come
            through :meth:`update_weights`).
        tokenizer: the policy's tokenizer (written for the managed replicas; EOS and pad ids).
        device: unused (the replicas have their own devices).
        seed: seed of the per-request sampling seeds.
        owns_module: unused (the replicas always hold their own weights).
    """

    runs_torch_module = False

    def __init__(self, config, module: nn.Module, tokenizer: PreTrainedTokenizerBase, device: str | torch.device,
                 seed: int, owns_module: bool) -> None:
        server = config.server
        if not server.urls:
            require_loopback_for_dev_mode(str(server.host), "actor_rollout_ref.rollout.server.host")
            if not server.cuda_devices and not torch.cuda.is_available():  # managed replicas on this CPU
                refuse_moe_reload_on_cpu(module)
        self.config, self.server, self.tokenizer = config, server, tokenizer
        self.backend = get_server_backend(config.name)
        self.names = PolicyWeightNames(module)
        self.weights_version = 0
        self.generator = torch.Generator().manual_seed(seed)
        self._seed = seed
        self._scratch = tempfile.TemporaryDirectory(prefix="rlvr-server-")
        scratch = Path(self._scratch.name)
        self.weights = WeightsFolder(server.weights_dir or scratch / "weights", self.names.hf_config)
        self.log_dir = Path(server.log_dir or tempfile.mkdtemp(prefix="rlvr-server-logs-"))
        self.replicas = self._replicas(module, scratch / "model")
        self.router = ReplicaRouter(len(self.replicas))
        self.pool = ThreadPoolExecutor(int(server.max_concurrent_requests), thread_name_prefix="rlvr-request")
        self._weights_lock = threading.RLock()
        self._stop = threading.Event()
        self._restarting: set[int] = set()
        self.counts = {"retries": 0, "restarts": 0}
        self.start_seconds: list[float] = []
        self._ready = threading.Event()
        self._start_error: BaseException | None = None
        self._supervisor = threading.Thread(target=self._supervise, name="rlvr-server-supervisor", daemon=True)
        self._finalizer = weakref.finalize(self, _shutdown, self.replicas, self._stop, self.pool, self._scratch)
        self._supervisor.start()
        self._ready.wait()
        if self._start_error is not None:
            self.close()
            raise self._start_error

    # ------------------------------------------------------------------ replicas
    def _replicas(self, module: nn.Module, model_dir: Path) -> list[ExternalReplica]:
        server, health = self.server, self.backend.health_path
        if server.urls:
            return [ExternalReplica(i, str(url), server.api_key, health) for i, url in enumerate(server.urls)]
        model_dir.mkdir(parents=True)  # the policy as it is now: vLLM reloads weights only from a real checkpoint
        write_checkpoint(model_dir, self.names.policy_weights(module.named_parameters()), self.names.hf_config)
        self.tokenizer.save_pretrained(model_dir)
        dtype = self.config.dtype or str(next(module.parameters()).dtype).removeprefix("torch.")
        replicas = []
        for i in range(int(server.num_replicas)):
            port = int(server.port) + i if int(server.port) else free_port(server.host)
            spec = LaunchSpec(
                python=server.python or sys.executable, model_dir=str(model_dir), host=server.host, port=port,
                api_key=server.api_key, seed=self._seed + i, dtype=dtype,
                cpu_bind=(_pick(server.cpu_binds, i, "rollout.server.cpu_binds")
                          or _core_binds(int(self.config.tensor_model_parallel_size))),
                cuda_devices=_pick(server.cuda_devices, i, "rollout.server.cuda_devices"),
                kv_cache_gb=int(server.kv_cache_space_gb), extra_args=[str(a) for a in server.extra_args],
                rollout=self.config)
            command, env = self.backend.launch(spec, dict(os.environ))
            replicas.append(ManagedReplica(i, server.host, port, server.api_key, command, env,
                                           self.log_dir / f"replica-{i}.log", health))
        return replicas

    def _supervise(self) -> None:
        """The supervisor thread: start every replica, then restart those that die. Managed replicas
        are started from this thread only (their parent-death signal is tied to it)."""
        try:
            start = time.perf_counter()
            for replica in self.replicas:
                replica.start()
            for replica in self.replicas:
                replica.wait_ready(float(self.server.startup_timeout_s))
                self.start_seconds.append(time.perf_counter() - start)
                self._load_current(replica)
        except BaseException as err:  # noqa: BLE001 - handed to the constructor, which raises it
            self._start_error = err
        finally:
            self._ready.set()
        if self._start_error is not None:
            return
        while not self._stop.wait(SUPERVISE_INTERVAL_S):
            for replica in self.replicas:
                if self._stop.is_set():
                    return
                self._check(replica)

    def _check(self, replica: ExternalReplica) -> None:
        """Restart a managed replica that exited; bring back a replica that was marked down once it
        answers again (with the current weights)."""
        i = replica.index
        if replica.managed and replica.exited():
            self.router.mark_down(i)
            if replica.starts > int(self.server.max_restarts):
                return
            self.counts["restarts"] += 1
            try:
                replica.start()
                replica.wait_ready(float(self.server.startup_timeout_s))
            except ReplicaError:
                return
        elif self.router.is_up(i) or not replica.healthy():
            return
        try:
            self._load_current(replica)
        except ReplicaError:
            return
        self.router.mark_up(i)

    def _load_current(self, replica: ExternalReplica) -> None:
        """Bring a replica that (re)joins to the current weights: those last pushed, or for a managed
        replica that has had none, the policy it started from (version 0: only the version is set)."""
        with self._weights_lock:
            if self.weights.current is not None:
                self._sync_replica(replica, str(self.weights.current), self.weights_version, {})
            elif replica.managed:
                call = self.backend.version_call(self.weights_version)
                call_json(replica.endpoint, call.method, call.path, call.payload, float(self.server.sync_timeout_s),
                          call.stage, f"weights version {self.weights_version}")

    def close(self) -> None:
        """Stop the supervisor and every managed replica (also run at garbage collection and exit)."""
        self._finalizer()

    # ------------------------------------------------------------------ weights and memory
    def update_weights(self, weights: Weights, version: int) -> dict[str, float]:
        """Write the weights once and load them into every replica as ``version``.

        Returns:
            Seconds per stage: ``write`` (the folder), then each call of the backend's sequence
            (slowest replica), and ``sync`` (all replicas, end to end).

        Raises:
            ReplicaError: no replica took the weights (those that failed are restarted or retried
                by the supervisor and get these weights before they serve).
        """
        timing: dict[str, float] = {}
        with self._weights_lock:
            start = time.perf_counter()
            folder = self.weights.write(self.names.policy_weights(weights), version)
            timing["write"] = time.perf_counter() - start
            start = time.perf_counter()
            up = [r for r in self.replicas if self.router.is_up(r.index)]
            futures = [self.pool.submit(self._sync_replica, r, str(folder), version, timing) for r in up]
            errors = []
            for replica, future in zip(up, futures):
                try:
                    future.result()
                except ReplicaUnavailable as err:
                    self.router.mark_down(replica.index)
                    errors.append(err)
            if len(errors) == len(up):
                raise ReplicaUnavailable("(all replicas)", "update_weights", "no replica loaded the weights: "
                                         + "; ".join(str(e) for e in errors) if errors else "no replica is up",
                                         f"weights version {version}")
            timing["sync"] = time.perf_counter() - start
            self.weights_version = version
            self.router.forget_sessions()
        return timing

    def _sync_replica(self, replica: ExternalReplica, folder: str, version: int, timing: dict[str, float]) -> None:
        for call in self.backend.sync_calls(folder, version):
            start = time.perf_counter()
            call_json(replica.endpoint, call.method, call.path, call.payload, float(self.server.sync_timeout_s),
                      call.stage, f"weights version {version}")
            timing[call.stage] = max(timing.get(call.stage, 0.0), time.perf_counter() - start)

    def wake_up(self) -> None:
        """Nothing to do: the replicas keep their weights and cache."""
        return None

    def sleep(self) -> None:
        """Nothing to free in this process (the replicas manage their own memory)."""
        return None

    def get_rng_state(self) -> dict:
        return {"generator": self.generator.get_state()}

    def set_rng_state(self, state: dict) -> None:
        self.generator.set_state(state["generator"])

    # ------------------------------------------------------------------ generation
    def _sampling(self, call: CallSettings) -> dict:
        params = call.sampling
        return {
            "max_tokens": call.response_length, "temperature": 0.0 if params.greedy else params.temperature,
            "top_p": params.top_p, "top_k": params.top_k if params.top_k > 0 else -1, "stop": list(call.stop),
            "stop_token_ids": None if self.config.ignore_eos else list(call.eos_ids),
        }

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per prompt row (``meta_info["n"]`` rows per prompt if given).

        See :mod:`rlvr.workers.rollout.base` for the keys; the output also has
        ``response_versions [B, R]`` (int64, -1 where ``response_mask`` is 0).
        """
        prompts, call = call_settings(self.config, self.tokenizer, prompts)
        input_ids, attention_mask, position_ids = (prompts.batch[k] for k in ("input_ids", "attention_mask",
                                                                              "position_ids"))
        sampling = self._sampling(call)
        sessions = prompts.non_tensor_batch.get(SESSION_KEY)
        jobs = []
        for row in range(input_ids.shape[0]):
            ids = input_ids[row][attention_mask[row].bool()].tolist()
            session = sessions[row] if sessions is not None else hashlib.sha1(str(ids).encode()).hexdigest()
            seed = int(torch.randint(0, 2**31 - 1, (1,), generator=self.generator))
            jobs.append(self.pool.submit(self._sample, ids, {**sampling, "seed": seed}, session, row))
        completions = [job.result() for job in jobs]
        responses, response_mask, log_probs, versions = self._pack(completions, call.response_length, call.pad_id)
        tensors = response_tensors(input_ids, attention_mask, position_ids, responses, response_mask, log_probs,
                                   versions)
        meta = {"rollout_log_prob_temperature": call.sampling.log_prob_temperature, "rollout_log_probs_exact": False,
                "rollout_weights_version": self.weights_version,
                "metrics": {"rollout/server_replicas_up": float(sum(self.router.up)),
                            "rollout/server_start_s": max(self.start_seconds, default=0.0),
                            "rollout/server_retries": float(self.counts["retries"]),
                            "rollout/server_restarts": float(self.counts["restarts"])}}
        return DataProto.from_dict(tensors=tensors, non_tensors=dict(prompts.non_tensor_batch), meta_info=meta)

    def _sample(self, prompt_ids: list[int], sampling: dict, session, row: int) -> tuple[Completion, int]:
        """One sample from some replica, retried elsewhere when a replica fails; ``(completion, replica)``.

        Raises:
            ReplicaUnavailable: every attempt failed (each failure is quoted).
            StaleRolloutError: a token was sampled with other weights than the engine's version.
        """
        what = f"sample {row}"
        path, body = self.backend.generate_request(prompt_ids, sampling)
        failed: list[int] = []
        errors: list[str] = []
        for attempt in range(int(self.server.max_retries) + 1):
            replica = self._acquire(session, failed, what)
            try:
                answer = call_json(self.replicas[replica].endpoint, "POST", path, body,
                                   float(self.server.request_timeout_s), "generate", what)
            except ReplicaUnavailable as err:
                errors.append(str(err))
                failed.append(replica)
                self.router.mark_down(replica)
                if attempt < int(self.server.max_retries):
                    self.counts["retries"] += 1
                continue
            finally:
                self.router.release(replica)
            completion = self.backend.parse_generate(answer)
            self._check_versions(completion, replica, row)
            return completion, replica
        raise ReplicaUnavailable("(every replica tried)", "generate",
                                 f"{len(errors)} attempt(s) failed:\n" + "\n".join(errors), what)

    def _acquire(self, session, failed: list[int], what: str) -> int:
        """A replica for the next attempt: one that has not failed this request if any is up, else
        any that is up (again); waits up to ``startup_timeout_s`` for one (a restart)."""
        deadline = time.perf_counter() + float(self.server.startup_timeout_s)
        while True:
            for exclude in (failed, ()):
                try:
                    return self.router.acquire(session, exclude)
                except NoReplicaError:
                    continue
            if time.perf_counter() > deadline or self._stop.is_set():
                raise ReplicaUnavailable("(none up)", "generate", f"no replica came up within "
                                         f"{self.server.startup_timeout_s:g} s (logs in {self.log_dir})", what)
            time.sleep(0.5)

    def _check_versions(self, completion: Completion, replica: int, row: int) -> None:
        stale = sorted({v for v in completion.versions if v != self.weights_version})
        if stale:
            raise StaleRolloutError(
                f"rollout server {self.replicas[replica].endpoint.name} sampled tokens of sample {row} with weights "
                f"version(s) {stale}, but the engine pushed version {self.weights_version} to every replica: that "
                "replica did not take the weight sync, so its samples are off-policy. Refusing them; check its log "
                f"({self.log_dir})")

    @staticmethod
    def _pack(results: list[tuple[Completion, int]], response_len: int, pad_id: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Right-padded ``responses``, ``response_mask``, ``log_probs`` and ``response_versions`` ``[b, R]``."""
        rows = len(results)
        responses = torch.full((rows, response_len), pad_id, dtype=torch.long)
        response_mask = torch.zeros(rows, response_len, dtype=torch.long)
        log_probs = torch.zeros(rows, response_len)
        versions = torch.full((rows, response_len), -1, dtype=torch.long)
        for row, (completion, _) in enumerate(results):
            length = min(len(completion.token_ids), response_len)
            responses[row, :length] = torch.tensor(completion.token_ids[:length], dtype=torch.long)
            response_mask[row, :length] = 1
            log_probs[row, :length] = torch.tensor(completion.log_probs[:length], dtype=torch.float32)
            versions[row, :length] = torch.tensor(completion.versions[:length], dtype=torch.long)
        return responses, response_mask, log_probs, versions


def _pick(values, index: int, key: str) -> str | None:
    """The ``index``-th entry of a per-replica list (None when the list is empty)."""
    if not values:
        return None
    if index >= len(values):
        raise ValueError(f"{key} has {len(values)} entries but replica {index} needs one (one per replica)")
    return str(values[index])


def _core_list(cores: list[int]) -> str:
    """Cores as a vLLM thread-binding list (``0-1`` or ``0,2,3``)."""
    if cores == list(range(cores[0], cores[-1] + 1)):
        return f"{cores[0]}-{cores[-1]}" if len(cores) > 1 else str(cores[0])
    return ",".join(str(c) for c in cores)


def _core_binds(ranks: int) -> str:
    """The cores this process may run on, split over a replica's ``ranks`` tensor-parallel workers
    (vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` takes one list per rank, joined by ``|``: ``0|1``); with fewer
    cores than ranks the ranks share them."""
    cores = sorted(os.sched_getaffinity(0))
    if ranks <= 1:
        return _core_list(cores)
    if len(cores) < ranks:
        return "|".join(_core_list([cores[r % len(cores)]]) for r in range(ranks))
    size = len(cores) // ranks
    return "|".join(_core_list(cores[r * size : (r + 1) * size]) for r in range(ranks))


def _shutdown(replicas: list[ExternalReplica], stop: threading.Event, pool: ThreadPoolExecutor,
              scratch: tempfile.TemporaryDirectory) -> None:
    stop.set()
    for replica in replicas:
        replica.stop()
    pool.shutdown(wait=False, cancel_futures=True)
    scratch.cleanup()
