"""Everything that turns a rolled-out batch into rewards.

- :mod:`rlvr.reward.scorers`: rule scorers by data source (``default_compute_score``, the scorer
  registry; GSM8K, math-verify, multiple choice, countdown, reasoning-gym, code, IFEval, judge,
  detection).
- :mod:`rlvr.reward.managers`: reward managers (``naive``, ``dapo``, ``batch``, ``parallel``) that
  score a batch with a scorer on the driver, and their registry (``reward_model.reward_manager``).
- :mod:`rlvr.reward.workers`: reward workers (rule, sandbox, judge, IFEval, detection), each run
  as its own worker group, and their registry (the names ``reward.routes`` uses).
- :mod:`rlvr.reward.router`: ``RewardRouter`` scores a mixed batch, each domain by its route.
- :mod:`rlvr.reward.routing`: the run's routing (``reward.routes``): checks, the reward worker
  groups, the router the trainer calls.
- :mod:`rlvr.reward.reward_fn`: ``load_reward_manager`` and ``compute_reward`` (the trainer's entry).
- :mod:`rlvr.reward.decode` (decoding a batch for scoring), :mod:`rlvr.reward.contract` (output
  checks), :mod:`rlvr.reward.config` (the ``reward`` config section and the workers' configs).

The same API is importable from verl's paths (:mod:`rlvr.reward.legacy_paths`). This package
module imports nothing, so ``rlvr.reward.config`` stays light for the config schema.
"""
