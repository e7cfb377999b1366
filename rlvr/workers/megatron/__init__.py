"""The Megatron-LM training backend (``strategy=megatron``): megatron-core models with tensor and
pipeline parallelism behind the same worker methods as FSDP2 (see ``docs/megatron.md``).

Importing this package does not import megatron-core (the config check reads
:mod:`rlvr.workers.megatron.layout` without it); the worker classes are in
:mod:`rlvr.workers.megatron.workers`.
"""

import logging
import warnings

# megatron-core reports at import that it falls back to its own (non-transformer-engine, non-apex)
# kernels: expected here, so not shown on every run
warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed", category=UserWarning)
warnings.filterwarnings("ignore", message="When using async grad allreduce it is recommended", category=UserWarning)
warnings.filterwarnings("ignore", message="Apex is not installed. Falling back to Torch Norm", category=UserWarning)
logging.getLogger("megatron.core.distributed.fsdp").setLevel(logging.WARNING)
