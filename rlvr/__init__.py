"""rlvr: reinforcement-learning post-training for LLMs with a single controller on Ray."""

__version__ = "0.1.0"
