"""What every reward manager shares: the protocol, decoding, the error policy and the metrics.

A reward manager turns a rolled-out batch into ``token_level_scores [batch, response_len]``:
it decodes each prompt and response (only the ``response_mask``-valid tokens), calls a scorer
``compute_score(data_source, solution_str, ground_truth, extra_info)``, and puts the score on
the LAST valid response token (the rest of the row stays 0).

Scorer results: a number, a dict with ``"score"`` (other keys, e.g. ``"acc"``, become
per-sample lists in ``reward_extra_info``), or ``None`` = "does not apply" (reward 0, left out
of the source's mean/acc, counted in ``reward/<source>/not_applicable``). A scorer that raises
or times out follows ``on_error``: ``raise`` -> :class:`RewardError` naming the sample index,
data source and cause; ``fallback`` -> ``fallback_score``, counted in
``reward/<source>/errors`` or ``reward/<source>/timeouts``. An unknown data source always raises.

Per data source ``<s>`` the metrics are ``reward/<s>/count`` (samples), ``mean_score`` (mean
reward over samples that were scored, fallbacks included), ``acc`` (mean of the scorer's
``"acc"`` where given), ``timeouts``, ``errors`` and ``not_applicable`` (counts).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np
import torch

from rlvr.protocol import DataProto
from rlvr.utils.errors import ConfigError, RewardError
from rlvr.utils.reward_score import ScorerTimeoutError, UnknownDataSourceError
from rlvr.workers.reward_manager.contract import check_token_level_scores

ON_ERROR_CHOICES = ("raise", "fallback")


@runtime_checkable
class AbstractRewardManager(Protocol):
    """``manager(data)`` -> ``token_level_scores [batch, response_len]``;
    ``manager(data, return_dict=True)`` -> ``{"reward_tensor", "reward_extra_info", "reward_metrics"}``."""

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]: ...


@dataclass
class DecodedBatch:
    """Text and labels of a batch, one entry per sample.

    Attributes:
        prompts / responses: decoded text of the valid prompt / response tokens.
        last_index: ``[batch]`` position of the last valid response token (0 for an empty response).
        response_length: ``[batch]`` number of valid response tokens.
    """

    prompts: list[str]
    responses: list[str]
    data_sources: list[str]
    ground_truths: list[Any]
    extra_infos: list[dict]
    last_index: torch.Tensor
    response_length: torch.Tensor
    response_len: int


def response_mask_of(data: DataProto) -> torch.Tensor:
    """``response_mask [batch, response_len]`` (derived from ``attention_mask`` when absent)."""
    response_len = data.batch["responses"].shape[-1]
    if "response_mask" in data.batch.keys():
        return data.batch["response_mask"]
    return data.batch["attention_mask"][:, -response_len:]


def last_valid_index(mask: torch.Tensor) -> torch.Tensor:
    """``[batch]`` index of the last 1 in each row of ``mask [batch, len]`` (0 for an all-zero row)."""
    positions = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    return torch.where(mask.bool(), positions, torch.zeros_like(positions)).max(dim=-1).values


def decode_batch(data: DataProto, tokenizer: Any, reward_fn_key: str = "data_source") -> DecodedBatch:
    """Decode prompts/responses and collect ``data_source``, ``ground_truth`` and ``extra_info``.

    Expects ``prompts [batch, P]`` (left-padded), ``responses [batch, R]``, ``attention_mask
    [batch, P+R]``, ``response_mask [batch, R]`` and the non-tensor ``reward_model`` (dicts with
    ``ground_truth``) and ``reward_fn_key`` arrays.
    """
    for key in (reward_fn_key, "reward_model"):
        if key not in data.non_tensor_batch:
            raise RewardError(
                f"the batch has no non-tensor field {key!r} (has: {sorted(data.non_tensor_batch)}); reward "
                f"managers need the data source under reward_fn_key={reward_fn_key!r} and "
                "reward_model={'ground_truth': ...} per sample"
            )
    prompts, responses = data.batch["prompts"], data.batch["responses"]
    prompt_mask = data.batch["attention_mask"][:, : prompts.shape[-1]].bool()
    mask = response_mask_of(data)
    last = last_valid_index(mask)
    has_tokens = mask.bool().any(dim=-1)
    # numpy rows: transformers' batch_decode converts them in one call each (python lists of ints
    # are type-checked element by element, several times slower for long responses)
    prompt_np, keep_np = prompts.cpu().numpy(), prompt_mask.cpu().numpy()
    ends = torch.where(has_tokens, last + 1, torch.zeros_like(last)).tolist()
    prompt_ids = [row[keep] for row, keep in zip(prompt_np, keep_np)]
    response_ids = [row[:end] for row, end in zip(responses.cpu().numpy(), ends)]
    extra = data.non_tensor_batch["extra_info"] if "extra_info" in data.non_tensor_batch else [None] * len(data)
    return DecodedBatch(
        prompts=tokenizer.batch_decode(prompt_ids, skip_special_tokens=True),
        responses=tokenizer.batch_decode(response_ids, skip_special_tokens=True),
        data_sources=[str(s) for s in data.non_tensor_batch[reward_fn_key]],
        ground_truths=[rm["ground_truth"] for rm in data.non_tensor_batch["reward_model"]],
        extra_infos=[dict(e) if e is not None else {} for e in extra],
        last_index=last,
        response_length=mask.sum(dim=-1).long(),
        response_len=responses.shape[-1],
    )


def check_on_error(on_error: str) -> str:
    if on_error not in ON_ERROR_CHOICES:
        raise ConfigError("reward_model.on_error", f"must be one of {ON_ERROR_CHOICES}, got {on_error!r}")
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
        on_error: ``raise`` or ``fallback`` (see the module docstring).
        fallback_score: reward of a failed sample under ``fallback``.
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

    def fail(self, index: int, kind: Literal["error", "timeout"], cause: object) -> None:
        """Apply the error policy to a sample whose scorer raised (``error``) or ran out of time."""
        if self.on_error == "raise":
            raise RewardError(
                f"scoring sample {index} (data_source {self.data_sources[index]!r}) "
                f"{'timed out' if kind == 'timeout' else 'failed'}: {cause}. Set reward_model.on_error=fallback "
                "to give such samples reward_model.fallback_score instead"
            )
        self.rewards[index], self.status[index] = self.fallback_score, kind

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


def error_policy_kwargs(config: Any) -> dict[str, Any]:
    """``on_error`` and ``fallback_score`` from the run config's ``reward_model`` section."""
    return {"on_error": config.reward_model.on_error, "fallback_score": config.reward_model.fallback_score}


def score_serially(compute_score: Any, decoded: DecodedBatch, book: RewardBook) -> None:
    """Call ``compute_score`` on every sample in this process and record the outcomes in ``book``."""
    for i, response in enumerate(decoded.responses):
        try:
            value = compute_score(
                data_source=decoded.data_sources[i],
                solution_str=response,
                ground_truth=decoded.ground_truths[i],
                extra_info=decoded.extra_infos[i],
            )
        except UnknownDataSourceError:
            raise
        except ScorerTimeoutError as exc:
            book.fail(i, "timeout", exc)
            continue
        except Exception as exc:  # noqa: BLE001 - any scorer failure goes through the error policy
            book.fail(i, "error", f"{type(exc).__name__}: {exc}")
            continue
        book.record(i, value)


class RewardManagerBase:
    """The shared skeleton of the reward managers: decode, score, apply the error policy, place
    the rewards on the last valid token and collect the metrics.

    Subclasses set their attributes with :meth:`_init_common` and override :meth:`_score` (how
    the samples are scored; returns extra metrics) and :meth:`config_kwargs` (constructor
    arguments read from the run config).
    """

    def _init_common(
        self, tokenizer: Any, num_examine: int, compute_score: Any, reward_fn_key: str, on_error: str, fallback_score: float
    ) -> None:
        """Store the arguments every manager takes (``compute_score`` already defaulted)."""
        self.tokenizer, self.num_examine = tokenizer, num_examine
        self.compute_score = compute_score
        self.reward_fn_key = reward_fn_key
        self.on_error, self.fallback_score = check_on_error(on_error), fallback_score

    @classmethod
    def config_kwargs(cls, config: Any) -> dict[str, Any]:
        """Manager-specific constructor arguments read from the run config (none by default)."""
        return {}

    @classmethod
    def from_config(cls, config: Any, tokenizer: Any, num_examine: int, compute_score: Any, **reward_kwargs: Any):
        kwargs = {**cls.config_kwargs(config), **error_policy_kwargs(config), **reward_kwargs}
        return cls(tokenizer, num_examine, compute_score, **kwargs)

    def _score(self, decoded: DecodedBatch, book: RewardBook) -> dict[str, float]:
        """Score every sample into ``book``; returns extra metrics. Default: one by one, in this process."""
        score_serially(self.compute_score, decoded, book)
        return {}

    def __call__(self, data: DataProto, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        """``token_level_scores [batch, response_len]``, or the dict with extra info and metrics."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        book = RewardBook(decoded.data_sources, self.on_error, self.fallback_score)
        metrics = self._score(decoded, book)
        print_examples(decoded, book.rewards, self.num_examine)
        return book.output(decoded, return_dict, metrics)


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
