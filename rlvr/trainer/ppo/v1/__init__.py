"""verl's ``verl.trainer.ppo.v1`` names rlvr serves (see :mod:`rlvr.trainer.ppo.v1.utils`)."""
