"""Parsing of ``algorithm.rollout_correction``'s thresholds and of verl's rejection options
(standard library only: the config check uses them before torch; the algorithms in
:mod:`~rlvr.trainer.ppo.rollout_correction` and :mod:`~rlvr.trainer.ppo.rollout_rejection` too)."""

from __future__ import annotations

__all__ = ["VERL_RS_OPTIONS", "is_rs_option_list", "is_threshold_bounds", "parse_rs_thresholds"]


VERL_RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
                   "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
"""verl's rejection options of ``rollout_correction.rollout_rs`` (:mod:`rlvr.trainer.ppo.rollout_rejection`),
accepted besides the ratio levels, alone or comma-separated."""


def is_rs_option_list(spec: object) -> bool:
    """Whether ``spec`` is one or more of :data:`VERL_RS_OPTIONS`, comma-separated."""
    parts = [part.strip() for part in spec.split(",") if part.strip()] if isinstance(spec, str) else []
    return bool(parts) and all(part in VERL_RS_OPTIONS for part in parts)


def _options(spec: str) -> list[str]:
    return list(dict.fromkeys(part.strip() for part in str(spec).split(",") if part.strip()))


def is_threshold_bounds(threshold: float | str) -> tuple[float | None, float]:
    """``(lower, upper)`` of ``rollout_is_threshold``: a number (or number string) is TIS's cap
    (lower None), verl's ``"lower_upper"`` string IcePop's band.

    Raises:
        ValueError: not a number or band, a bound <= 0, or lower > upper.
    """
    if isinstance(threshold, bool):
        raise ValueError("rollout_is_threshold is a number or a 'lower_upper' string, not a boolean")
    text = str(threshold).strip()
    try:
        low, _, high = text.partition("_") if "_" in text else ("", "", text)
        lower, upper = (float(low) if low else None), float(high)
    except ValueError:
        raise ValueError(f"{threshold!r} is not a threshold: give a number (e.g. 2.0) or 'lower_upper' "
                         "(e.g. '0.5_2.0')") from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"{threshold!r}: the bounds must be > 0 and lower <= upper")
    return lower, upper


def parse_rs_thresholds(options: str, spec: object) -> dict[str, tuple[float | None, float]]:
    """Option -> ``(lower or None, upper)`` from ``rollout_rs_threshold`` (see the module docstring).

    Raises:
        ValueError: a missing, malformed or non-positive threshold, or a count that is neither one
            nor one per option.
    """
    names = _options(options)
    if spec is None:
        raise ValueError(f"rollout_rs={options} needs rollout_rs_threshold")
    specs = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(specs) not in (1, len(names)):
        raise ValueError(f"rollout_rs_threshold gives {len(specs)} thresholds for {len(names)} options; give one, "
                         "or one per option")
    specs = specs * len(names) if len(specs) == 1 else specs
    out: dict[str, tuple[float | None, float]] = {}
    for name, text in zip(names, specs):
        try:
            if name.endswith("k1"):
                low, _, high = text.rpartition("_") if "_" in text else ("", "", text)
                upper = float(high)
                lower = float(low) if low else 1.0 / upper
            else:
                if "_" in text:
                    raise ValueError(f"option {name} takes one upper bound, got {text!r}")
                lower, upper = None, float(text)
        except ValueError as err:
            raise ValueError(f"rollout_rs_threshold {text!r} for {name}: {err}") from None
        if upper <= 0 or (lower is not None and not 0 < lower <= upper):
            raise ValueError(f"rollout_rs_threshold {text!r} for {name}: bounds must be positive, lower <= upper")
        out[name] = (lower, upper)
    return out
