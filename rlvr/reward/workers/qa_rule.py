"""Question-answering rule workers: ``GeneralValRuleRewardWorker``, ``CrossThinkQARuleRewardWorker``,
``MultipleChoiceBoxedRuleRewardWorker``.

All three score the answer part of a response: the text after the last ``</think>``; an unclosed
``<think>`` is a format failure and scores 0 (see :func:`rlvr.reward.workers.base.split_think`).
They compute the same reward in training and in validation.
"""

from __future__ import annotations

import re
import string
from typing import Any

from rlvr.protocol import DataProto
from rlvr.reward.config import CrossThinkQARuleRewardConfig, GeneralValRuleRewardConfig, MultipleChoiceBoxedRuleRewardConfig
from rlvr.reward.decode import extra_infos
from rlvr.reward.scorers.text import answer_tag, last_boxed, last_nonempty_line
from rlvr.reward.workers.base import RuleRewardWorker, ScoredBatch, split_think
from rlvr.reward.workers.registry import register_reward_worker
from rlvr.utils.errors import ConfigError, RewardError

_OPTION = re.compile(r"^\s*(?:\\text\{)?\s*\(?([A-J])\)?\s*\}?\s*(?:[.):]|\s|$)")
_STANDALONE_LETTER = re.compile(r"(?<![A-Za-z0-9])([A-J])(?![A-Za-z0-9])")
_STRICT_LINE = re.compile(
    r"^(?:\**\s*(?:final\s+)?answer\s*:?\**\s*|the\s+(?:final\s+)?answer\s+is\s*:?\s*)\(?([A-J])\)?\.?$|^\\boxed\{\(?([A-J])\)?\}\.?$",
    re.IGNORECASE,
)


def option_letter(text: str) -> str | None:
    """The option letter that ``text`` is or starts with (``"B"``, ``"(b)"``, ``"B) Paris"`` -> ``"B"``);
    a lower-case letter counts only when it stands alone."""
    alone = re.fullmatch(r"\s*\(?([A-Ja-j])\)?\s*", text)
    if alone:
        return alone.group(1).upper()
    match = _OPTION.match(text)
    return match.group(1) if match else None


def _truth_letter(truth: Any) -> str:
    letter = option_letter(str(truth))
    if letter is None:
        raise RewardError(f"multiple-choice ground truth {truth!r} is not an option letter A-J (e.g. 'B' or '(B) Paris')")
    return letter


def normalize_answer(text: str) -> str:
    """Lower case, punctuation and the articles a/an/the removed, white space collapsed (SQuAD-style)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


# ------------------------------------------------------------------------------- general QA
@register_reward_worker("general_val", GeneralValRuleRewardConfig)
class GeneralValRuleRewardWorker(RuleRewardWorker):
    """Correctness for general QA (validation-time metric, usable as a training reward).

    The answer is the last ``<answer>...</answer>``, else the last ``\\boxed{}``, else the whole
    answer part. The ground truth is a string or a list of acceptable strings. Reward 1.0 when the
    :func:`normalize_answer` forms are equal (``exact``), or, with ``match_mode="contains"``, when a
    normalised reference occurs in the normalised answer on word boundaries.
    Metrics: ``reward/general_val/{exact_match,contains}``.
    """

    metric_prefix = "general_val"

    def __init__(self, worker_config: GeneralValRuleRewardConfig) -> None:
        if worker_config.match_mode not in ("exact", "contains"):
            raise ConfigError("match_mode", f"must be 'exact' or 'contains', got {worker_config.match_mode!r}")
        super().__init__(worker_config)

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        rewards, exact, contains = [], [], []
        for response, truth in zip(responses, truths):
            body, well_formed = split_think(response)
            tagged = answer_tag(body)
            answer = normalize_answer(tagged if tagged is not None else (last_boxed(body) or body))
            refs = [normalize_answer(str(t)) for t in (truth if isinstance(truth, (list, tuple)) else [truth])]
            is_exact = well_formed and answer in refs
            has = well_formed and any(r and re.search(rf"(?<!\w){re.escape(r)}(?!\w)", answer) for r in refs)
            exact.append(float(is_exact))
            contains.append(float(bool(has)))
            rewards.append(float(is_exact or (self.worker_config.match_mode == "contains" and bool(has))))
        return ScoredBatch(rewards, metrics={"exact_match": exact, "contains": contains})


# ------------------------------------------------------------------------------- CrossThinkQA
@register_reward_worker("crossthinkqa", CrossThinkQARuleRewardConfig)
class CrossThinkQARuleRewardWorker(RuleRewardWorker):
    """Multiple-choice reasoning QA (CrossThink-QA) with three reward types, on the answer part:

    * ``strict`` — the last non-empty line is exactly the required answer format with the correct
      letter: ``Answer: X``, ``Final answer: X``, ``The answer is X`` or ``\\boxed{X}`` (``X`` may be
      in parentheses; a final period is allowed; case-insensitive keywords, upper-case letter);
    * ``soft`` — the correct letter is the last stand-alone option letter (A-J, not part of a word)
      in the last non-empty line (``"So the choice is (B)."``);
    * ``loose`` — the correct letter appears anywhere in the answer part as a stand-alone letter,
      or the correct option's text does (given as ``"B) Paris"`` in the ground truth or as
      ``extra_info["answer_text"]``), case-insensitively.

    Reward 1.0 or 0.0; metrics ``reward/crossthinkqa/{strict,soft,loose}`` (all three, whatever the type).
    """

    metric_prefix = "crossthinkqa"

    def __init__(self, worker_config: CrossThinkQARuleRewardConfig) -> None:
        if worker_config.reward_type not in ("strict", "soft", "loose"):
            raise ConfigError("reward_type", f"must be 'strict', 'soft' or 'loose', got {worker_config.reward_type!r}")
        super().__init__(worker_config)

    @staticmethod
    def judge(response: str, truth: Any, answer_text: str | None = None) -> dict[str, bool]:
        """``{"strict", "soft", "loose"}`` verdicts of one response."""
        letter = _truth_letter(truth)
        body, well_formed = split_think(response)
        line = last_nonempty_line(body) or ""
        strict_match = _STRICT_LINE.match(line)
        strict = strict_match is not None and letter in strict_match.groups()
        line_letters = _STANDALONE_LETTER.findall(line)
        soft = bool(line_letters) and line_letters[-1] == letter
        text = answer_text or re.sub(r"^\s*\(?[A-J]\)?\s*[.):]?\s*", "", str(truth)).strip()
        loose = letter in _STANDALONE_LETTER.findall(body) or (bool(text) and text.lower() in body.lower())
        return {"strict": well_formed and strict, "soft": well_formed and soft, "loose": well_formed and loose}

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        verdicts = [
            self.judge(r, t, info.get("answer_text")) for r, t, info in zip(responses, truths, extra_infos(data))
        ]
        rewards = [float(v[self.worker_config.reward_type]) for v in verdicts]
        metrics = {kind: [float(v[kind]) for v in verdicts] for kind in ("strict", "soft", "loose")}
        return ScoredBatch(rewards, metrics=metrics)


# ------------------------------------------------------------------------------- boxed multiple choice
@register_reward_worker("mc_boxed", MultipleChoiceBoxedRuleRewardConfig)
class MultipleChoiceBoxedRuleRewardWorker(RuleRewardWorker):
    """Multiple choice with the answer in ``\\boxed{X}`` (the last ``\\boxed{}`` of the answer part,
    whose content is an option letter, optionally ``(X)``, ``\\text{X}`` or ``X) text``).

    Reward 1.0 when the letter equals the ground-truth letter, 0.0 when it differs, and
    ``format_error_reward`` when there is no boxed letter. Training and validation compute the same
    reward (a peer implementation returns zeros during training; this one does not).
    Metrics: ``reward/mc_boxed/{correct,format_error}``.
    """

    metric_prefix = "mc_boxed"

    def score(self, responses: list[str], truths: list[Any], data: DataProto) -> ScoredBatch:
        rewards, correct, format_error = [], [], []
        for response, truth in zip(responses, truths):
            expected = _truth_letter(truth)
            body, well_formed = split_think(response)
            boxed = last_boxed(body) if well_formed else None
            chosen = option_letter(boxed) if boxed is not None else None
            format_error.append(float(chosen is None))
            correct.append(float(chosen == expected))
            rewards.append(self.worker_config.format_error_reward if chosen is None else float(chosen == expected))
        return ScoredBatch(rewards, metrics={"correct": correct, "format_error": format_error})
