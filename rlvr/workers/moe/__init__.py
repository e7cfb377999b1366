"""Mixture-of-experts models: their routers (:mod:`.routers`), the load-balancing loss and expert-load
statistics (:mod:`.balance`), the batch's ``routed_experts`` (:mod:`.layout`), routing replay in the
actor (:mod:`.actor_routing`) and route recording in the rollout (:mod:`.rollout_routes`).

This package's root stays free of torch, so the config checks can read :data:`REPLAY_MODES` and
:func:`router_replay_mode`.
"""

REPLAY_MODES = ("disabled", "R2", "R3")
"""verl's ``router_replay.mode``: off, replay the actor's own ``compute_log_prob`` routes in the
update (R2), replay the rollout's routes in ``compute_log_prob`` and the update (R3)."""


def router_replay_mode(actor_config) -> str:
    """The actor's ``router_replay.mode``: the section of its own backend (``megatron`` when
    ``strategy=megatron``, else ``fsdp_config``)."""
    section = actor_config.megatron if actor_config.strategy == "megatron" else actor_config.fsdp_config
    return str(section.router_replay.mode)
