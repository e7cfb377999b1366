"""A project of your own on top of rlvr: "guess my number".

Importing this package registers, with rlvr's registries,

- the environment ``guess_number`` (:mod:`guess_number.environment`): "higher" / "lower" after
  every wrong guess;
- the tool ``compare`` (:mod:`guess_number.tools`, listed in ``tools.yaml``): the model asks
  whether a guess is too small or too big before it answers;
- the advantage estimator ``group_median`` (:mod:`guess_number.estimator`);
- the policy loss ``clipped_reinforce`` (:mod:`guess_number.loss`);
- the reward manager ``guess_reward`` (:mod:`guess_number.reward`).

``trainer.user_modules=[guess_number]`` (in ``guess_number.yaml``) makes the ``rlvr`` command import
it in the driver and in every worker process, so these names are valid in the config.
"""

from guess_number import environment, estimator, loss, reward, tools  # noqa: F401 - importing registers them
