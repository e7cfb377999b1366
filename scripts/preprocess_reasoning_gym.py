"""A reasoning-gym task -> rlvr RL data (train + held-out test); see ``rlvr.data_prep.reasoning_gym``."""

from rlvr.data_prep.reasoning_gym import main

if __name__ == "__main__":
    main()
