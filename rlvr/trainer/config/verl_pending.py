"""verl 0.9 keys whose feature rlvr is still building in another issue (standard library only).

Each rule names the issue and the feature. A key of a rule that rlvr's schema does not have yet is
accepted only at a value that asks for what rlvr does today (its ``inert`` values, or any value
while the rule's ``gate`` key says the feature is off), and dropped then; any other value is refused
naming the issue. The list shrinks as those issues land: their keys become schema fields.
``docs/verl_compat.md`` marks these keys "pending: issue N".
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

ANY = object()
"""``inert`` value: every value of the key asks for what rlvr does today."""


@dataclass(frozen=True)
class Pending:
    """Keys matching ``pattern`` (``*`` matches across dots) belong to issue ``issue``.

    Attributes:
        pattern: dotted-key glob.
        issue: the rlvr issue that builds the feature.
        feature: what the keys do, in a few words.
        inert: the values that ask for rlvr's behaviour today (accepted and dropped).
        gate: ``(key, off values)``: while ``key`` (a dotted-key glob) has one of the off values or
            is absent, the feature is off and every key of the rule is accepted.
    """

    pattern: str
    issue: int
    feature: str
    inert: tuple = ()
    gate: tuple[str, tuple] | None = None


def _profiler(prefix: str, issue: int = 44) -> Pending:
    return Pending(f"{prefix}.profiler.*", issue, "the per-role profiler", gate=(f"{prefix}.profiler.enable", (False,)))


PENDING: tuple[Pending, ...] = (
    # issue 42: scale settings (placements)
    Pending("actor_rollout_ref.rollout.data_parallel_size", 42, "vLLM data parallelism inside a rollout replica", (1,)),
    Pending("actor_rollout_ref.rollout.tensor_model_parallel_size", 42, "rollout tensor parallelism > 1", (1,)),
    Pending("actor_rollout_ref.rollout.pipeline_model_parallel_size", 42, "rollout pipeline parallelism", (1,)),
    Pending("actor_rollout_ref.rollout.nnodes", 42, "a standalone rollout pool sized in the rollout section "
            "(rlvr's top-level rollout.nnodes / rollout.n_gpus_per_node size a rollout apart)", (0,)),
    Pending("actor_rollout_ref.rollout.n_gpus_per_node", 42, "a standalone rollout pool sized in the rollout "
            "section (rlvr's top-level rollout.nnodes / rollout.n_gpus_per_node size a rollout apart)", (ANY,)),
    Pending("trainer.balance_batch", 42, "balanced batches (trainer.balance_batch)", (False,)),
    Pending("*.megatron.context_parallel_size", 42, "Megatron context parallelism", (1, None)),
    Pending("*.megatron.dynamic_context_parallel", 42, "Megatron dynamic context parallelism", (False,)),
    Pending("*.megatron.max_seqlen_per_dp_cp_rank", 42, "Megatron context parallelism (sequence budget per rank)",
            (None,)),
    # issue 43: reward models, teachers and verl's reward sections
    Pending("reward.*", 43, "verl's reward section (reward loop, reward models)"),
    Pending("reward_model.*", 43, "verl's reward_model section (reward models)", gate=("reward_model.enable", (None, False))),
    Pending("sandbox_fusion.*", 43, "verl's legacy sandbox_fusion section (moved to reward.sandbox_fusion)",
            (None,)),
    Pending("data.return_raw_input_ids", 43, "reward models with a tokenizer of their own", (False,)),
    Pending("distillation.*", 43, "distillation from teacher models", gate=("distillation.enabled", (False,))),
    # issue 44: profiling, dumps and validation-only runs
    _profiler("actor_rollout_ref.actor"), _profiler("actor_rollout_ref.ref"), _profiler("actor_rollout_ref.rollout"),
    _profiler("critic"),
    Pending("global_profiler.*", 44, "the profiler (global_profiler)", gate=("global_profiler.tool", (None,))),
    Pending("trainer.rollout_data_dir", 44, "dumps of the rollouts (trainer.rollout_data_dir)", (None,)),
    Pending("trainer.validation_data_dir", 44, "dumps of the validation generations", (None,)),
    Pending("trainer.val_only", 44, "validation-only runs (trainer.val_only)", (False,)),
    # issue 41 items 4-5: the keys of the algorithms verl 0.9.1 registers that rlvr lacks
    Pending("actor_rollout_ref.actor.calculate_sum_pi_squared", 41, "the optimal-token-baseline estimator's "
            "sum of squared probabilities", (False,)),
    Pending("actor_rollout_ref.actor.policy_loss.dro_beta", 41, "the DRO policy loss", (None,)),
    Pending("actor_rollout_ref.actor.tau_pos", 41, "the SAPO policy loss", (ANY,)),
    Pending("actor_rollout_ref.actor.tau_neg", 41, "the SAPO policy loss", (ANY,)),
)
"""Every pending key rule, by issue."""


def pending_rule(key: str) -> Pending | None:
    """The rule a dotted key falls under, or None."""
    return next((rule for rule in PENDING if fnmatchcase(key, rule.pattern)), None)


def _gate_off(rule: Pending, values: dict[str, Any]) -> bool:
    if rule.gate is None:
        return False
    gate_key, off = rule.gate
    return all(value in off for key, value in values.items() if fnmatchcase(key, gate_key))


def pending_refusal(key: str, value: Any, values: dict[str, Any]) -> str | None:
    """Why ``key=value`` cannot run yet (None: it asks for what rlvr does today). ``values`` holds
    every dotted leaf of the config being loaded (for the rule's gate)."""
    rule = pending_rule(key)
    if rule is None or ANY in rule.inert or value in rule.inert or _gate_off(rule, values):
        return None
    today = f" (rlvr runs {key.rpartition('.')[2]}={rule.inert[0]!r} today)" if rule.inert else ""
    return (f"{rule.feature} is not in rlvr yet: issue {rule.issue} builds it{today}; remove the key or set it "
            f"to {' / '.join(repr(v) for v in rule.inert) or 'its off value'}")
