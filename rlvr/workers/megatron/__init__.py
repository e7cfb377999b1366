"""The Megatron-LM training backend (``strategy=megatron``): megatron-core models with tensor and
pipeline parallelism behind the same worker methods as FSDP2 (see ``docs/megatron.md``).

Importing this package does not import megatron-core (the config check reads
:mod:`rlvr.workers.megatron.layout` without it); the worker classes are in
:mod:`rlvr.workers.megatron.workers`.
"""
