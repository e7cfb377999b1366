"""The ``rlvr`` console command (see :func:`rlvr.trainer.main_ppo.main`)."""

from __future__ import annotations

import sys

from rlvr.trainer.main_ppo import main as _main


def main() -> None:
    """``rlvr [--preset NAME] [--help-config] [--print-config] key=value ...``"""
    sys.exit(_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
