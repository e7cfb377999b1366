"""Domain routing: one batch, several reward sources.

:class:`RewardRouter` splits a batch by a non-tensor field (``data_source`` or ``tag``), scores
each part with the route registered for that domain, and reassembles ``token_level_scores``,
the per-sample extra info and the metrics in the batch's original order. A domain without a
route is an error naming it and the known ones (no silent default).

A route is one of:

- a reward worker or worker group: anything with ``compute_rewards(DataProto) -> DataProto``
  returning ``token_level_rewards [b, R]``, ``response_level_rewards [b]`` and ``scores [b]``
  (the reward-worker protocol). Its token-level scores are ``token_level_rewards`` when a row
  carries the response's reward (its sum must equal ``response_level_rewards``); a row left all
  zero (as a worker written from scratch may leave it, ``examples/custom_reward_worker.py``) gets
  ``response_level_rewards`` on its last valid response token; any other mismatch is an error.
  ``scores`` feed ``reward/<domain>/mean_score`` and ``reward/<domain>/count``, and the worker's
  ``meta_info["metrics"]`` are passed on (lists averaged);
- a reward manager (``manager(data, return_dict=True)``, see :mod:`rlvr.reward.managers.base`);
- a scorer function ``(data_source, solution_str, ground_truth, extra_info)``, wrapped in a
  :class:`NaiveRewardManager` with the router's tokenizer and error policy;
- a :class:`WeightedRoute`: a weighted sum of such sources (``reward.routes.<domain>=
  'reward_model+0.5*math_rule'``), with each source's score logged as
  ``reward/<domain>/<source>/mean_score``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.custom import CustomRewardFunction
from rlvr.reward.decode import last_valid_index, response_mask_of
from rlvr.reward.contract import ACC_THRESHOLD, check_token_level_scores, check_worker_output
from rlvr.reward.managers.naive import NaiveRewardManager


@runtime_checkable
class RewardWorkerLike(Protocol):
    """A reward worker or worker group (the reward-worker protocol)."""

    def compute_rewards(self, data: DataProto) -> DataProto: ...


@dataclass
class RouteOutput:
    """What one route produced for its part of the batch (``b`` samples)."""

    token_level_scores: torch.Tensor  # [b, response_len]
    extra_info: dict[str, list] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def _token_scores_from_worker(tensors: dict[str, torch.Tensor], part: DataProto, source: str) -> torch.Tensor:
    """``[b, R]`` token-level scores of a worker output (see the module docstring)."""
    token_level, response_level = tensors["token_level_rewards"], tensors["response_level_rewards"]
    row_sums = token_level.sum(dim=-1)
    empty_rows = (token_level == 0).all(dim=-1)
    consistent = torch.isclose(row_sums, response_level, atol=1e-3, rtol=1e-3) | empty_rows
    if not bool(consistent.all()):
        row = int((~consistent).nonzero()[0])
        raise RewardError(
            f"{source} returned token_level_rewards summing to {row_sums[row].item():.4f} for sample {row} but "
            f"response_level_rewards {response_level[row].item():.4f}; put the response reward on the last valid "
            "token (or leave token_level_rewards all zero to have it placed there)"
        )
    scores = token_level.clone()
    place = empty_rows & (response_level != 0)
    rows = torch.arange(len(scores))[place]
    scores[rows, last_valid_index(response_mask_of(part))[place]] = response_level[place]
    return scores


def _score_with_worker(worker: RewardWorkerLike, domain: str, part: DataProto) -> RouteOutput:
    batch_size, response_len = part.batch["responses"].shape
    source = f"reward route {domain!r} ({type(worker).__name__}.compute_rewards)"
    output = worker.compute_rewards(part)
    tensors = check_worker_output(output, batch_size, response_len, source)
    metrics = {f"reward/{domain}/mean_score": float(tensors["scores"].mean()), f"reward/{domain}/count": float(batch_size)}
    for name, value in output.meta_info.get("metrics", {}).items():
        metrics[name] = float(sum(value) / len(value)) if isinstance(value, list) else float(value)
    return RouteOutput(_token_scores_from_worker(tensors, part, source), {"score": tensors["scores"].tolist()}, metrics)


def _score_with_manager(manager: Any, domain: str, part: DataProto) -> RouteOutput:
    result = manager(part, return_dict=True)
    source = f"reward route {domain!r} ({type(manager).__name__})"
    if not isinstance(result, dict) or "reward_tensor" not in result:
        raise RewardError(f"{source} returned {type(result).__name__}; with return_dict=True a reward manager must return a dict with 'reward_tensor'")
    batch_size, response_len = part.batch["responses"].shape
    tensor = check_token_level_scores(result["reward_tensor"], batch_size, response_len, source)
    return RouteOutput(tensor.float(), dict(result.get("reward_extra_info", {})), dict(result.get("reward_metrics", {})))


def _score_route(route: Any, domain: str, part: DataProto) -> RouteOutput:
    if isinstance(route, RewardWorkerLike):
        return _score_with_worker(route, domain, part)
    return _score_with_manager(route, domain, part)


class WeightedRoute:
    """A weighted sum of reward sources for one domain: ``sum_i w_i * scores_i`` per token.

    Each source is a reward worker (group) or a reward manager, named as in ``reward.routes``. A
    source's sequence score is logged as ``reward/<domain>/<name>/mean_score`` and kept per sample as
    extra info ``<name>/score``, weight 0 included (a 0-weighted rule beside a reward model measures
    what the reward model is not rewarding). A sample's ``acc`` is the verdict of the first source
    that gives one: its ``acc`` extra info when it reports one, else its score >= 1, except for the
    sources named in ``accuracy_exempt`` (a reward model's score is no verdict).

    Args:
        domain: the route's domain (metric names).
        terms: ``(weight, name, source)`` in the route's order.
        accuracy_exempt: source names whose score is not a correctness verdict (``reward_model``).
    """

    def __init__(self, domain: str, terms: list[tuple[float, str, Any]], accuracy_exempt: tuple[str, ...] = ()) -> None:
        if not terms:
            raise RewardError(f"route {domain!r}: a weighted route needs at least one source")
        self.domain, self.terms, self.accuracy_exempt = domain, terms, accuracy_exempt

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        batch_size, response_len = data.batch["responses"].shape
        total = torch.zeros(batch_size, response_len, dtype=torch.float32)
        extra: dict[str, list] = {}
        metrics: dict[str, float] = {}
        verdict: list | None = None
        for weight, name, source in self.terms:
            output = _score_route(source, f"{self.domain}/{name}", data)
            total += weight * output.token_level_scores
            scores = output.token_level_scores.sum(-1)
            metrics.update(output.metrics)
            metrics[f"reward/{self.domain}/{name}/mean_score"] = float(scores.mean()) if batch_size else 0.0
            for key, values in output.extra_info.items():
                extra[f"{name}/{key}"] = list(values)
            extra[f"{name}/score"] = scores.tolist()
            if verdict is None and "acc" in output.extra_info:
                verdict = list(output.extra_info["acc"])
            elif verdict is None and name not in self.accuracy_exempt:
                verdict = [float(score >= ACC_THRESHOLD) for score in scores.tolist()]
        if verdict is not None:
            extra["acc"] = verdict
        metrics[f"reward/{self.domain}/mean_score"] = float(total.sum(-1).mean()) if batch_size else 0.0
        if not return_dict:
            return total
        return {"reward_tensor": total, "reward_extra_info": extra, "reward_metrics": metrics}


def _is_scorer(route: Any) -> bool:
    return inspect.isfunction(route) or isinstance(route, (functools.partial, CustomRewardFunction))


class RewardRouter:
    """Score a mixed-domain batch by routing each sample on ``non_tensor_batch[key]``.

    Args:
        routes: domain name -> reward worker (group), reward manager, or scorer function.
        key: the non-tensor field holding the domain (``data_source`` or ``tag``).
        tokenizer: decodes text for scorer-function routes (needed only by those).
        num_examine / on_error / fallback_score: passed to the managers built for scorer routes.
    """

    def __init__(
        self,
        routes: dict[str, Any],
        key: str = "data_source",
        tokenizer: Any = None,
        num_examine: int = 0,
        on_error: str | None = None,
        fallback_score: float = 0.0,
    ) -> None:
        if not routes:
            raise RewardError("RewardRouter needs at least one route (domain -> scorer, manager or reward worker)")
        self.key = key
        self.routes: dict[str, Any] = {}
        for domain, route in routes.items():
            if _is_scorer(route):
                if tokenizer is None:
                    raise RewardError(f"route {domain!r} is a scorer function; give RewardRouter a tokenizer to decode responses")
                route = NaiveRewardManager(tokenizer, num_examine, route, on_error=on_error, fallback_score=fallback_score)
            elif not (isinstance(route, RewardWorkerLike) or callable(route)):
                raise RewardError(
                    f"route {domain!r} is a {type(route).__name__}; expected a reward worker (compute_rewards), "
                    "a reward manager or a scorer function"
                )
            self.routes[str(domain)] = route

    def _domains(self, data: DataProto) -> list[str]:
        if self.key not in data.non_tensor_batch:
            raise RewardError(
                f"RewardRouter routes on non-tensor field {self.key!r}, which the batch lacks "
                f"(has: {sorted(data.non_tensor_batch)})"
            )
        domains = [str(d) for d in data.non_tensor_batch[self.key]]
        unknown = sorted(set(domains) - set(self.routes))
        if unknown:
            raise RewardError(
                f"no reward route for {self.key} {', '.join(map(repr, unknown))}; known {self.key} values: "
                f"{', '.join(sorted(self.routes))}. Add a route for it"
            )
        return domains

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]`` in the batch's order (or the full dict)."""
        domains = self._domains(data)
        batch_size, response_len = data.batch["responses"].shape
        reward_tensor = torch.zeros(batch_size, response_len, dtype=torch.float32)
        extra_info: dict[str, list] = {}
        metrics: dict[str, float] = {}
        for domain in dict.fromkeys(domains):
            rows = [i for i, d in enumerate(domains) if d == domain]
            route = self.routes[domain]
            output = _score_route(route, domain, data.select_idxs(rows))
            reward_tensor[rows] = output.token_level_scores
            for name, values in output.extra_info.items():
                column = extra_info.setdefault(name, [None] * batch_size)
                for row, value in zip(rows, values):
                    column[row] = value
            metrics.update(output.metrics)
        if not return_dict:
            return reward_tensor
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra_info, "reward_metrics": metrics}
