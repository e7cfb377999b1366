"""``python -m rlvr.model_merger merge|test ...`` (see :mod:`rlvr.model_merger`)."""

import sys

from rlvr.model_merger import main

sys.exit(main())
