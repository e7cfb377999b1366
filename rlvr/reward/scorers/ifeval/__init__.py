"""IFEval instruction-following scorer (Zhou et al., 2023, arXiv:2311.07911).

A sample carries IFEval's own fields: ``instruction_id_list`` (e.g. ``["punctuation:no_comma"]``)
and ``kwargs`` (one dict per instruction; ``None`` values, as in the Hugging Face copy of the data,
are dropped). Each instruction is checked

* **strictly** on the response as is, and
* **loosely** on eight variants of it — the response, without its first line, without its last
  line, without both, and each of those with ``*`` removed — passing if any non-empty variant passes.

Metrics: prompt-level accuracy (all instructions of the sample pass) and instruction-level accuracy
(fraction of instructions that pass), strict and loose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from rlvr.utils.errors import RewardError
from rlvr.reward.scorers.ifeval.instructions import INSTRUCTIONS, count_sentences, count_words

__all__ = ["INSTRUCTIONS", "IFEvalResult", "compute_score", "count_sentences", "count_words", "evaluate", "parse_ground_truth"]


@dataclass
class IFEvalResult:
    """Per-instruction pass flags of one response, strict and loose."""

    instruction_ids: list[str]
    strict: list[bool]
    loose: list[bool]

    @property
    def prompt_strict(self) -> bool:
        return all(self.strict)

    @property
    def prompt_loose(self) -> bool:
        return all(self.loose)

    @property
    def instruction_strict(self) -> float:
        return sum(self.strict) / len(self.strict)

    @property
    def instruction_loose(self) -> float:
        return sum(self.loose) / len(self.loose)


def _loose_variants(response: str) -> list[str]:
    lines = response.split("\n")
    base = [response, "\n".join(lines[1:]), "\n".join(lines[:-1]), "\n".join(lines[1:-1])]
    return [v for v in base + [v.replace("*", "") for v in base] if v.strip()]


def _check(instruction_id: str, response: str, kwargs: dict) -> bool:
    try:
        checker = INSTRUCTIONS.get(instruction_id)
    except KeyError as exc:
        raise RewardError(f"IFEval sample uses an unsupported instruction: {exc.args[0]}") from exc
    try:
        return bool(response.strip()) and checker(response, **kwargs)
    except (TypeError, ValueError) as exc:
        raise RewardError(
            f"IFEval instruction {instruction_id!r} got bad kwargs {kwargs!r}: {exc}; "
            "use the argument names of IFEval's data files"
        ) from exc


def evaluate(response: str, instruction_id_list: list[str], kwargs_list: list[dict]) -> IFEvalResult:
    """Check every instruction of one sample, strictly and loosely."""
    if len(instruction_id_list) != len(kwargs_list) or not instruction_id_list:
        raise RewardError(
            f"IFEval sample needs one kwargs dict per instruction and at least one instruction; got "
            f"{len(instruction_id_list)} instruction(s) and {len(kwargs_list)} kwargs dict(s)"
        )
    strict, loose = [], []
    variants = _loose_variants(response)
    for instruction_id, raw_kwargs in zip(instruction_id_list, kwargs_list):
        kwargs = {k: v for k, v in (raw_kwargs or {}).items() if v is not None}
        strict.append(_check(instruction_id, response, kwargs))
        loose.append(any(_check(instruction_id, v, kwargs) for v in variants))
    return IFEvalResult(list(instruction_id_list), strict, loose)


def parse_ground_truth(ground_truth: dict | str) -> tuple[list[str], list[dict]]:
    """``(instruction_id_list, kwargs)`` from a dict or JSON string in IFEval's format."""
    if isinstance(ground_truth, str):
        try:
            ground_truth = json.loads(ground_truth)
        except json.JSONDecodeError as exc:
            raise RewardError(f"IFEval ground truth is not valid JSON ({exc}): {ground_truth[:200]!r}") from exc
    if not isinstance(ground_truth, dict) or "instruction_id_list" not in ground_truth:
        raise RewardError(
            "IFEval ground truth must be a dict with 'instruction_id_list' and 'kwargs' "
            f"(IFEval's format); got {str(ground_truth)[:200]!r}"
        )
    ids = list(ground_truth["instruction_id_list"])
    kwargs = list(ground_truth.get("kwargs") or [{} for _ in ids])
    return ids, kwargs


def compute_score(solution_str: str, ground_truth: dict | str, reward_mode: str = "fraction", loose: bool = False) -> float:
    """Reward of one response: ``fraction`` of instructions passed, or ``all`` (1.0 only when every
    instruction passes); strict checks unless ``loose``."""
    if reward_mode not in ("fraction", "all"):
        raise RewardError(f"IFEval reward_mode must be 'fraction' or 'all', got {reward_mode!r}")
    result = evaluate(solution_str, *parse_ground_truth(ground_truth))
    flags = result.loose if loose else result.strict
    return sum(flags) / len(flags) if reward_mode == "fraction" else float(all(flags))
