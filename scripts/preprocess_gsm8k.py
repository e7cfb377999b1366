"""GSM8K -> rlvr RL data; see ``rlvr.data_prep.gsm8k`` (same options)."""

from rlvr.data_prep.gsm8k import main

if __name__ == "__main__":
    main()
