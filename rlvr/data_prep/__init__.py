"""Turn public datasets and procedural task generators into rlvr's RL data format (parquet/JSONL).

- ``python -m rlvr.data_prep.gsm8k``: GSM8K from local JSONL files or the hub.
- ``python -m rlvr.data_prep.reasoning_gym``: any reasoning-gym task, a train set and a fixed
  held-out set.
- ``python -m rlvr.data_prep.mixed``: a small mixed-domain set (math, IFEval-style instructions,
  code) for reward routing (the ``rlvr_mixed`` preset).
"""
