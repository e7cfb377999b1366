"""verl's ``model.lora`` settings of a Megatron run and the layers they adapt (plain Python: the
config check reads it without torch).

The layers are megatron's: ``linear_qkv`` (q, k, v fused), ``linear_proj`` (``o_proj``),
``linear_fc1`` (gate, up fused), ``linear_fc2`` (``down_proj``). ``type=lora`` adapts the fused
layers as they are; ``type=canonical_lora`` puts one adapter on each of ``linear_q``, ``linear_k``,
``linear_v``, ``linear_fc1_gate``, ``linear_fc1_up`` (as peft does on the HF model) and on
``linear_proj`` / ``linear_fc2``. A ``target_modules`` entry is a layer name or a glob over the full
name ``decoder.layers.<layer>.<self_attention|mlp>.<name>`` (``<layer>``: the decoder layer's index
in the whole model, whatever the pipeline stage); with ``target_modules=[]``, every layer except
those ``exclude_modules`` names is adapted.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["LoraSpec", "Site", "ROW_PARALLEL", "FUSED_TARGETS", "CANONICAL_TARGETS", "INIT_METHODS", "LORA_TYPES", "layer_sites"]

LORA_TYPES = ("lora", "canonical_lora")
"""verl's ``model.lora.type`` values rlvr runs (``dora``, ``vlm_lora`` are refused)."""

ROW_PARALLEL = ("linear_proj", "linear_fc2")
"""The row-parallel layers (``A`` cut over the ranks, ``B`` whole); the others are column parallel."""
FUSED_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")
"""``type=lora`` targets (verl's default ``target_modules``)."""
CANONICAL_TARGETS = ("linear_q", "linear_k", "linear_v", "linear_proj", "linear_fc1_gate", "linear_fc1_up",
                     "linear_fc2")
"""``type=canonical_lora`` targets."""
INIT_METHODS = ("xavier", "kaiming", "normal", "zero")
"""``lora_A_init_method`` / ``lora_B_init_method`` values: xavier-normal, kaiming-uniform (a = sqrt 5),
normal (std 0.2), zeros (the initialisations of Megatron-Bridge's adapters)."""

# the parts of each megatron layer: (canonical target, part) ...
_PARTS = {"linear_qkv": (("linear_q", "q"), ("linear_k", "k"), ("linear_v", "v")),
          "linear_fc1": (("linear_fc1_gate", "gate"), ("linear_fc1_up", "up")),
          "linear_proj": (("linear_proj", "fused"),), "linear_fc2": (("linear_fc2", "fused"),)}
_SUBMODULE = {"linear_qkv": "self_attention", "linear_proj": "self_attention", "linear_fc1": "mlp",
              "linear_fc2": "mlp"}


@dataclass(frozen=True)
class LoraSpec:
    """The adapters of a run (``actor_rollout_ref.model.lora``).

    Attributes:
        rank: ``r``. alpha: the scale is ``alpha / r``.
        kind: ``lora`` (fused layers) | ``canonical_lora`` (q, k, v, gate, up apart).
        targets: target module names or globs of full names (``decoder.layers.<global layer>.<sub>.<name>``).
        excludes: with empty ``targets``: every layer of the kind except these.
        dropout / dropout_position: dropout probability on the adapter's input (``pre``) or output (``post``).
        a_init / b_init: :data:`INIT_METHODS`. seed: of the full adapters' initial values.
        dtype: of the adapters' parameters (None: the model's).
    """

    rank: int
    alpha: float
    kind: str = "lora"
    targets: tuple[str, ...] = FUSED_TARGETS
    excludes: tuple[str, ...] = ()
    dropout: float = 0.0
    dropout_position: str = "pre"
    a_init: str = "xavier"
    b_init: str = "zero"
    seed: int = 0
    dtype: str | None = None

    @classmethod
    def from_config(cls, lora, seed: int = 0) -> LoraSpec:
        """The spec of a ``model.lora`` section (:class:`~rlvr.trainer.config.schema.MegatronLoraConfig`)."""
        return cls(rank=int(lora.rank), alpha=float(lora.alpha), kind=str(lora.type),
                   targets=tuple(lora.target_modules or ()), excludes=tuple(lora.exclude_modules or ()),
                   dropout=float(lora.dropout), dropout_position=str(lora.dropout_position),
                   a_init=str(lora.lora_A_init_method), b_init=str(lora.lora_B_init_method), seed=int(seed),
                   dtype=lora.dtype)

    @property
    def scale(self) -> float:
        """``alpha / rank``."""
        return self.alpha / self.rank

    def problems(self) -> list[str]:
        """What is wrong with the settings (empty: nothing)."""
        names = CANONICAL_TARGETS if self.kind == "canonical_lora" else FUSED_TARGETS
        out = []
        if self.kind not in LORA_TYPES:
            out.append(f"type={self.kind!r}: rlvr's Megatron LoRA is lora or canonical_lora")
        if self.rank < 1:
            out.append(f"rank={self.rank}: must be >= 1")
        if not 0.0 <= self.dropout < 1.0:
            out.append(f"dropout={self.dropout}: must be in [0, 1)")
        if self.dropout_position not in ("pre", "post"):
            out.append(f"dropout_position={self.dropout_position!r}: pre or post")
        for key, value in (("lora_A_init_method", self.a_init), ("lora_B_init_method", self.b_init)):
            if value not in INIT_METHODS:
                out.append(f"{key}={value!r}: one of {', '.join(INIT_METHODS)}")
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            out.append(f"dtype={self.dtype!r}: null (the model's), float32, bfloat16 or float16")
        if self.targets and self.excludes:
            out.append("target_modules and exclude_modules are both set: exclude_modules needs target_modules=[]")
        for target in self.targets:
            if "*" not in target and "?" not in target and target not in names:
                other = "lora" if self.kind == "canonical_lora" else "canonical_lora"
                hint = (f" (a type={other} name)" if target in (FUSED_TARGETS + CANONICAL_TARGETS) else "")
                out.append(f"target_modules entry {target!r}{hint}: type={self.kind} takes {', '.join(names)} or "
                           "globs of full names like '*.layers.0.*.linear_qkv'")
        if not self.targets and not self.excludes:
            out.append("target_modules is empty: name the layers that get adapters (or exclude_modules)")
        return out


@dataclass(frozen=True)
class Site:
    """One adapted megatron layer of one decoder layer.

    Attributes:
        module: ``linear_qkv | linear_proj | linear_fc1 | linear_fc2``.
        path: the layer's module path in the stage's ``GPTModel`` (local layer index).
        parts: ``("fused",)`` or the adapted canonical parts (``q``, ``k``, ``v`` / ``gate``, ``up``).
    """

    module: str
    path: str
    parts: tuple[str, ...]

    @property
    def column(self) -> bool:
        """Column parallel (``linear_qkv``, ``linear_fc1``); else row parallel."""
        return self.module not in ROW_PARALLEL


def _matches(name: str, full: str, patterns: tuple[str, ...]) -> bool:
    return any(p == name or fnmatchcase(full, p) for p in patterns)


def layer_sites(spec: LoraSpec, layer: int, local: int) -> list[Site]:
    """The adapted layers of global decoder layer ``layer`` (``local``: its index on the stage)."""
    sites = []
    for module in FUSED_TARGETS:
        path = f"decoder.layers.{local}.{_SUBMODULE[module]}.{module}"
        full = f"decoder.layers.{layer}.{_SUBMODULE[module]}"
        if spec.kind == "lora" or module in ROW_PARALLEL:
            names = [(module, "fused")]
        else:
            names = list(_PARTS[module])
        chosen = tuple(part for name, part in names
                       if (_matches(name, f"{full}.{name}", spec.targets) if spec.targets
                           else not _matches(name, f"{full}.{name}", spec.excludes)))
        if chosen:
            sites.append(Site(module, path, chosen))
    return sites
