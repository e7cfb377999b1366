"""What every reward manager shares: the protocol, the one constructor, the error policy, scoring in
this process or in killable helper processes, and the metrics.

A reward manager turns a rolled-out batch into ``token_level_scores [batch, response_len]``:
it decodes each prompt and response (:mod:`rlvr.reward.decode`), calls a scorer
``compute_score(data_source, solution_str, ground_truth, extra_info)`` (an ``async def`` scorer
too: the samples of a batch are then awaited together), and puts the score on the LAST valid
response token (the rest of the row stays 0).

Scorer results: a number, a dict with ``"score"`` (other keys, e.g. ``"acc"``, become
per-sample lists in ``reward_extra_info``), or ``None`` = "does not apply" (reward 0, left out
of the source's mean/acc, counted in ``reward/<source>/not_applicable``). A scorer that raises
or runs out of time follows ``on_error``: ``raise`` -> the scorer's own exception propagates with a
note naming the sample index and data source (a timeout or a failure in a helper process raises
:class:`RewardError`); ``fallback`` -> ``fallback_score``, counted in ``reward/<source>/errors`` or
``reward/<source>/timeouts``; ``fallback_timeouts`` -> a timeout gets ``fallback_score`` (counted) and
any other failure raises. A scorer that raises ``TimeoutError`` itself counts as a timeout, as in verl.
Unset (None), ``on_error`` is the manager's ``default_on_error``: ``fallback_timeouts`` for the naive
manager and its subclasses (verl's naive manager scores a timed-out sample 0 and goes on),
``raise`` for the others. Every batch with fallback scores logs one warning. An unknown data source
always raises.

Per data source ``<s>`` the metrics are ``reward/<s>/count`` (samples), ``mean_score`` (mean
reward over samples that were scored, fallbacks included), ``acc`` (mean of the scorer's
``"acc"`` where given), ``timeouts``, ``errors`` and ``not_applicable`` (counts).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import pickle
from collections import defaultdict
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.reward.config import ON_ERROR_CHOICES
from rlvr.reward.contract import check_token_level_scores
from rlvr.reward.decode import DecodedBatch, decode_batch
from rlvr.reward.scorers import UnknownDataSourceError, default_compute_score
from rlvr.reward.scorers.process_pool import TimeoutProcessPool
from rlvr.reward.scorers.registry import call_scorer, call_scorer_tagged
from rlvr.utils.errors import ConfigError, RewardError

logger = logging.getLogger(__name__)


class RewardConfigError(ConfigError, AssertionError):
    """An invalid reward-manager argument: a :class:`ConfigError` naming the key, and an
    ``AssertionError`` as well, since verl asserts these."""


@runtime_checkable
class AbstractRewardManager(Protocol):
    """``manager(data)`` -> ``token_level_scores [batch, response_len]``;
    ``manager(data, return_dict=True)`` -> ``{"reward_tensor", "reward_extra_info", "reward_metrics"}``."""

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]: ...


def check_on_error(on_error: str | None, default: str = "raise") -> str:
    """``on_error`` checked against ``ON_ERROR_CHOICES``; None gives ``default``."""
    on_error = default if on_error is None else on_error
    if on_error not in ON_ERROR_CHOICES:
        raise RewardConfigError("reward_model.on_error", f"must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
    return on_error


def normalize_score(value: Any, index: int, data_source: str) -> tuple[float | None, dict]:
    """A scorer result as ``(score or None, per-sample extras)``; a malformed result raises."""
    if value is None:
        return None, {}
    extras: dict = {}
    if isinstance(value, dict):
        if "score" not in value:
            raise RewardError(
                f"scorer for data_source {data_source!r} returned a dict without 'score' for sample {index} "
                f"(keys: {sorted(value)}); a dict result must contain 'score'"
            )
        extras, value = dict(value), value["score"]
    if not isinstance(value, (bool, int, float, np.integer, np.floating)):
        raise RewardError(
            f"scorer for data_source {data_source!r} returned {type(value).__name__} for sample {index}; "
            "expected a number, a dict with 'score', or None"
        )
    if not math.isfinite(float(value)):
        raise RewardError(f"scorer for data_source {data_source!r} returned a non-finite score {value} for sample {index}")
    return float(value), extras


class RewardBook:
    """Per-sample scores, extras and failure counts of one batch; builds the manager output.

    Args:
        data_sources: ``[batch]`` data source of each sample (the metric group).
        on_error: ``raise``, ``fallback`` or ``fallback_timeouts`` (see the module docstring).
        fallback_score: reward of a failed sample that falls back.
    """

    def __init__(self, data_sources: list[str], on_error: str = "raise", fallback_score: float = 0.0) -> None:
        self.data_sources = data_sources
        self.on_error, self.fallback_score = check_on_error(on_error), float(fallback_score)
        self.rewards = [0.0] * len(data_sources)
        self.status: list[str] = ["pending"] * len(data_sources)
        self.extras: list[dict] = [{} for _ in data_sources]

    def record(self, index: int, value: Any) -> None:
        score, extras = normalize_score(value, index, self.data_sources[index])
        self.extras[index] = extras
        if score is None:
            self.status[index] = "not_applicable"
        else:
            self.rewards[index], self.status[index] = score, "ok"

    def add(self, index: int, delta: float, extras: dict) -> None:
        """Add ``delta`` to a scored sample's reward and merge ``extras`` into its per-sample info."""
        self.rewards[index] += float(delta)
        self.extras[index].update(extras)

    def fail(self, index: int, kind: Literal["error", "timeout"], cause: BaseException | str) -> None:
        """Apply the error policy to a sample whose scorer raised (``error``) or ran out of time.

        When the sample does not fall back (:meth:`falls_back`), a scorer exception raised in this
        process propagates as itself (so callers catch the type the scorer raised) with a note naming
        the sample; a timeout or a failure reported by a helper process raises :class:`RewardError`.
        """
        if self.falls_back(kind):
            self.rewards[index], self.status[index] = self.fallback_score, kind
            return
        where = f"scoring sample {index} (data_source {self.data_sources[index]!r})"
        option = "fallback_timeouts (timeouts only) or fallback" if kind == "timeout" else "fallback"
        hint = f"Set reward_model.on_error={option} to give such samples reward_model.fallback_score instead"
        if isinstance(cause, BaseException) and not isinstance(cause, RewardError):
            cause.add_note(f"({where} failed. {hint})")
            raise cause
        verb = "timed out" if kind == "timeout" else "failed"
        raise RewardError(f"{where} {verb}: {cause}. {hint}")

    def falls_back(self, kind: Literal["error", "timeout"]) -> bool:
        """Whether a sample that failed with ``kind`` gets ``fallback_score`` (else it raises)."""
        return self.on_error == "fallback" or (self.on_error == "fallback_timeouts" and kind == "timeout")

    def log_fallbacks(self) -> None:
        """One warning naming how many samples of each data source fell back, and why."""
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for source, status in zip(self.data_sources, self.status):
            if status in ("timeout", "error"):
                counts[(source, status)] += 1
        if counts:
            parts = ", ".join(f"{n} {'timed out' if kind == 'timeout' else 'raised'} (data_source {source!r})"
                              for (source, kind), n in sorted(counts.items()))
            logger.warning("reward scoring: %s; scored fallback_score=%g (on_error=%s; counted in "
                           "reward/<data_source>/timeouts and /errors)", parts, self.fallback_score, self.on_error)

    def reward_extra_info(self) -> dict[str, list]:
        """Per-sample lists (length batch) of every extra key any sample returned (None where absent)."""
        keys = sorted({key for extras in self.extras for key in extras})
        return {key: [extras.get(key) for extras in self.extras] for key in keys}

    def metrics(self) -> dict[str, float]:
        groups: dict[str, list[int]] = defaultdict(list)
        for i, source in enumerate(self.data_sources):
            groups[source].append(i)
        metrics: dict[str, float] = {}
        for source, rows in groups.items():
            prefix = f"reward/{source}/"
            scored = [i for i in rows if self.status[i] != "not_applicable"]
            accs = [float(self.extras[i]["acc"]) for i in scored if "acc" in self.extras[i]]
            metrics[prefix + "count"] = float(len(rows))
            for kind in ("timeout", "error", "not_applicable"):
                name = "timeouts" if kind == "timeout" else "errors" if kind == "error" else kind
                metrics[prefix + name] = float(sum(self.status[i] == kind for i in rows))
            if scored:
                metrics[prefix + "mean_score"] = float(np.mean([self.rewards[i] for i in scored]))
            if accs:
                metrics[prefix + "acc"] = float(np.mean(accs))
        return metrics

    def output(self, decoded: DecodedBatch, return_dict: bool, extra_metrics: dict | None = None) -> Any:
        """Place the rewards on the last valid token; the tensor or the full dict."""
        rewards = torch.tensor(self.rewards, dtype=torch.float32)
        reward_tensor = torch.zeros(len(rewards), decoded.response_len, dtype=torch.float32)
        reward_tensor[torch.arange(len(rewards)), decoded.last_index] = rewards
        check_token_level_scores(reward_tensor, len(rewards), decoded.response_len, "reward manager")
        if not return_dict:
            return reward_tensor
        return {
            "reward_tensor": reward_tensor,
            "reward_extra_info": self.reward_extra_info(),
            "reward_metrics": {**self.metrics(), **(extra_metrics or {})},
        }


def _scorer_kwargs(decoded: DecodedBatch, index: int) -> dict[str, Any]:
    return {
        "data_source": decoded.data_sources[index],
        "solution_str": decoded.responses[index],
        "ground_truth": decoded.ground_truths[index],
        "extra_info": decoded.extra_infos[index],
    }


def _score_each(compute_score: Any, decoded: DecodedBatch) -> list[Any]:
    """Each sample's score, or the exception its scorer raised; the samples of an ``async`` scorer
    are awaited together in one event loop."""
    kwargs = [_scorer_kwargs(decoded, i) for i in range(len(decoded.responses))]
    if inspect.iscoroutinefunction(compute_score):
        async def gather() -> list[Any]:
            return await asyncio.gather(*(compute_score(**kw) for kw in kwargs), return_exceptions=True)

        return asyncio.run(gather())
    outcomes: list[Any] = []
    for kw in kwargs:
        try:
            outcomes.append(call_scorer(compute_score, kw))
        except Exception as exc:  # noqa: BLE001 - any scorer failure goes through the error policy
            outcomes.append(exc)
    return outcomes


def score_serially(compute_score: Any, decoded: DecodedBatch, book: RewardBook) -> None:
    """Call ``compute_score`` on every sample in this process and record the outcomes in ``book``."""
    for i, outcome in enumerate(_score_each(compute_score, decoded)):
        if isinstance(outcome, UnknownDataSourceError):
            raise outcome
        if isinstance(outcome, TimeoutError):  # ScorerTimeoutError, or the scorer's own (verl counts both)
            book.fail(i, "timeout", outcome)
        elif isinstance(outcome, Exception):
            book.fail(i, "error", outcome)
        else:
            book.record(i, outcome)


def score_in_pool(pool: TimeoutProcessPool, compute_score: Any, decoded: DecodedBatch, book: RewardBook) -> None:
    """Score every sample in ``pool``'s helper processes, each under the pool's time limit; a
    crash or a sample over the limit (its process killed) goes through the error policy."""
    tasks = [(compute_score, _scorer_kwargs(decoded, i)) for i in range(len(decoded.responses))]
    for i, result in enumerate(pool.run(call_scorer_tagged, tasks)):
        if result.status != "ok":
            book.fail(i, result.status, result.error)
            continue
        tag, value = result.value
        if tag == "unknown":
            raise RewardError(value)
        if tag == "timeout":
            book.fail(i, "timeout", value)
        else:
            book.record(i, value)


def is_picklable(compute_score: Any) -> bool:
    """Whether ``compute_score`` can go to a helper process."""
    try:
        pickle.dumps(compute_score)
    except Exception:  # noqa: BLE001 - any pickling failure means the same
        return False
    return True


def check_picklable(compute_score: Any, why: str) -> None:
    """Raise a :class:`RewardError` saying ``why`` when ``compute_score`` cannot go to a helper process."""
    try:
        pickle.dumps(compute_score)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means the same fix
        raise RewardError(
            f"{why}, so compute_score must be picklable, but {compute_score!r} is not ({exc}); use a module-level "
            "function or custom_reward_function.path/name"
        ) from exc


class RewardManagerBase:
    """The shared skeleton of the reward managers: decode, score, apply the error policy, place
    the rewards on the last valid token and collect the metrics.

    Subclasses add their own arguments after these and override :meth:`_score` (how the samples
    are scored; returns extra metrics) and :meth:`config_kwargs` (constructor arguments read from
    the run config).

    Args:
        tokenizer: decodes ``prompts`` / ``responses`` (needs ``batch_decode``).
        num_examine: decoded samples printed per data source per call.
        compute_score: ``(data_source, solution_str, ground_truth, extra_info) -> float | dict | None``;
            None uses the class's ``default_compute_score``.
        reward_fn_key: non-tensor field that names the data source.
        on_error: ``raise`` | ``fallback`` | ``fallback_timeouts`` for a scorer that raises or runs out
            of time; None: the class's ``default_on_error`` (see the module docstring).
        fallback_score: reward of a failed sample that falls back.
    """

    default_compute_score = staticmethod(default_compute_score)
    default_on_error = "raise"

    def __init__(self, tokenizer: Any, num_examine: int, compute_score: Any = None, reward_fn_key: str = "data_source",
                 *, on_error: str | None = None, fallback_score: float = 0.0) -> None:
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self.compute_score = compute_score or self.default_compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error, self.fallback_score = check_on_error(on_error, self.default_on_error), fallback_score
        self.pool: TimeoutProcessPool | None = None

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        """Manager-specific constructor arguments read from the run config (none by default)."""
        return {}

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **reward_kwargs: Any):
        error_policy = {"on_error": config.reward_model.on_error, "fallback_score": config.reward_model.fallback_score,
                        "reward_fn_key": config.data.reward_fn_key}
        kwargs = {**cls.config_kwargs(config), **error_policy, **reward_kwargs}
        return cls(tokenizer, num_examine, compute_score, **kwargs)

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        """Score every sample into ``book``; returns extra metrics. Default: one by one, in this
        process, or in the helper processes when the manager has a pool."""
        if self.pool is None:
            score_serially(self.compute_score, decoded, book)
        else:
            score_in_pool(self.pool, self.compute_score, decoded, book)
        return {}

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]``, or the dict with extra info and metrics."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        book = RewardBook(decoded.data_sources, self.on_error, self.fallback_score)
        metrics = self._score(decoded, book)
        book.log_fallbacks()
        print_examples(decoded, book.rewards, self.num_examine)
        return book.output(decoded, return_dict, metrics)

    def close(self) -> None:
        """Stop the helper processes, if any (a later call starts new ones)."""
        if self.pool is not None:
            self.pool.close()

    def __enter__(self) -> RewardManagerBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def print_examples(decoded: DecodedBatch, rewards: list[float], num_examine: int) -> None:
    """Print the first ``num_examine`` samples of every data source."""
    shown: dict[str, int] = defaultdict(int)
    for i, source in enumerate(decoded.data_sources):
        if shown[source] >= num_examine:
            continue
        shown[source] += 1
        print(
            f"[{source}] sample {i}\n[prompt] {decoded.prompts[i]}\n[response] {decoded.responses[i]}\n"
            f"[ground_truth] {decoded.ground_truths[i]}\n[score] {rewards[i]}",
            flush=True,
        )
