"""Math answers checked with math-verify (Hugging Face): the last ``\\boxed{}`` of the response
against the ground truth, compared symbolically, so ``\\frac{1}{2}``, ``0.5`` and ``1/2`` agree.

``<think>`` sections are removed first. A response without a ``\\boxed{}`` scores 0.

Time limit: math-verify parses with sympy, which can run for minutes on adversarial input
(``\\boxed{9^{9^{9^{9}}}}``). On the main thread the limit is math-verify's own (a SIGALRM
timer, whole seconds); on any other thread, where signals cannot be used, the check runs in a
one-process :class:`TimeoutProcessPool` that kills it at the limit. Either way a sample over
the limit raises :class:`ScorerTimeoutError`, which reward managers turn into an error or the
configured fallback score (counted in ``reward/<source>/timeouts``).
"""

from __future__ import annotations

import atexit
import functools
import math
import threading
from typing import Any

from rlvr.reward.scorers.process_pool import TimeoutProcessPool
from rlvr.reward.scorers.registry import ScorerTimeoutError, register_scorer
from rlvr.reward.scorers.text import last_boxed, strip_think

DEFAULT_TIMEOUT_S = 5.0

_thread_pool_lock = threading.Lock()
_thread_pool: TimeoutProcessPool | None = None


def _seconds(timeout_s: float) -> int:
    """math-verify's timers take whole seconds; round up so the limit is never shorter."""
    return max(1, math.ceil(timeout_s))


@functools.lru_cache(maxsize=4096)
def _parse_gold(ground_truth: str, timeout_s: float) -> list:
    from math_verify import parse

    text = ground_truth if "\\boxed" in ground_truth else "\\boxed{" + ground_truth + "}"
    return parse(text, parsing_timeout=_seconds(timeout_s))


def _verify_in_main_thread(boxed: str, ground_truth: str, timeout_s: float) -> bool:
    """Parse and compare with math-verify's SIGALRM timeouts; raises ScorerTimeoutError."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    gold = _parse_gold(ground_truth, timeout_s)
    if not gold:
        raise ValueError(f"math ground truth {ground_truth!r} cannot be parsed by math-verify; fix the data")
    try:
        predicted = parse("\\boxed{" + boxed + "}", parsing_timeout=_seconds(timeout_s), raise_on_error=True)
        if not predicted:
            return False
        return bool(verify(gold, predicted, timeout_seconds=_seconds(timeout_s), raise_on_error=True))
    except TimeoutException as exc:
        raise ScorerTimeoutError(f"math-verify gave up after {_seconds(timeout_s)} s on \\boxed{{{boxed[:200]}}}") from exc
    except (ValueError, TypeError, AttributeError, RecursionError, NotImplementedError):
        return False  # sympy/latex2sympy could not make sense of the answer: unparseable = wrong


def _import_math_verify() -> None:
    """Import math-verify (and sympy) in a helper process before its first sample, so the import is
    not counted against the sample's time limit."""
    import math_verify  # noqa: F401


def _verify_in_pool(boxed: str, ground_truth: str, timeout_s: float) -> bool:
    """Off the main thread: run the check in a helper process killed at the limit."""
    global _thread_pool
    with _thread_pool_lock:
        limit = _seconds(timeout_s) + 1.0  # math-verify's own timer first; the kill is the backstop
        if _thread_pool is not None and _thread_pool.timeout_s != limit:
            _thread_pool.close()
            _thread_pool = None
        if _thread_pool is None:
            _thread_pool = TimeoutProcessPool(num_workers=1, timeout_s=limit, initializer=_import_math_verify)
        (result,) = _thread_pool.run(_verify_in_main_thread, [(boxed, ground_truth, timeout_s)])
    if result.status == "ok":
        return bool(result.value)
    if result.status == "timeout" or "ScorerTimeoutError" in result.error:
        raise ScorerTimeoutError(f"math-verify gave up after {timeout_s:g} s on \\boxed{{{boxed[:200]}}}")
    raise RuntimeError(f"math-verify failed in its helper process: {result.error}")


def compute_score(solution_str: str, ground_truth: Any, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict:
    """Score one response: 1.0 when its last ``\\boxed{}`` equals ``ground_truth``, else 0.0.

    Returns:
        ``{"score": float, "acc": float}``.

    Raises:
        ScorerTimeoutError: math-verify ran past ``timeout_s``.
    """
    boxed = last_boxed(strip_think(solution_str))
    if boxed is None or not boxed.strip():
        return {"score": 0.0, "acc": 0.0}
    if threading.current_thread() is threading.main_thread():
        correct = _verify_in_main_thread(boxed, str(ground_truth), timeout_s)
    else:
        correct = _verify_in_pool(boxed, str(ground_truth), timeout_s)
    return {"score": float(correct), "acc": float(correct)}


@register_scorer(
    ["math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500", "math_verify",
     "hiyouga/geometry3k"]
)
def compute_score_registered(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None) -> dict:
    """Registry entry for math data sources (default time limit)."""
    return compute_score(solution_str, ground_truth)


def close_helper_pool() -> None:
    """Stop the helper process used off the main thread (a later call starts a new one)."""
    global _thread_pool
    with _thread_pool_lock:
        if _thread_pool is not None:
            _thread_pool.close()
            _thread_pool = None


atexit.register(close_helper_pool)
