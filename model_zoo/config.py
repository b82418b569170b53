"""``ModelConfig``: one point of the zoo's configuration space, with a stable id.

A config names an architecture and a value on every axis. Its id is a hash of
the fields it sets (``set_fields``: those away from their defaults), so the
same config gets the same id in every process and on every machine, a new
field with a default renames no config (the gate would see every stored case
as missing), and a result stored under an id can always be rebuilt from it
(``ModelConfig.from_dict``). The price: changing a field's default changes
what an old id runs, so a default, once published, stays. Zero for ``batch`` or ``size`` and ``None`` for a
size knob mean "the architecture's default"; ``registry.resolve`` fills them
in, and every config the space enumerates is already resolved.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

DTYPES = ("float32", "bfloat16", "float16")
MODES = ("eval", "train", "steps")
EXECUTIONS = ("eager", "compile")
ATTN_IMPLS = ("default", "eager", "sdpa", "flex")
KNOBS = ("layers", "hidden", "heads", "experts")


def _bad(name: str, value: Any, hint: str) -> ValueError:
    return ValueError(f"{name}={value!r} (type={type(value).__name__}): {hint}")


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    """What to build and how to run it.

    ``arch`` is a registry name ``family/architecture[:task]``; ``size`` is
    the family's main size (sequence length for text, image side for images,
    samples or frames for audio, nodes for graphs); ``steps`` is K for mode
    ``steps`` (``0`` elsewhere). ``execution`` and ``attn`` are carried for the
    runner; the builder checks that the architecture supports them.
    """

    arch: str
    dtype: str = "float32"
    batch: int = 0
    size: int = 0
    mode: str = "train"
    steps: int = 0
    execution: str = "eager"
    attn: str = "default"
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    experts: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.arch, str) or "/" not in self.arch:
            raise _bad("arch", self.arch, "expected a registry name 'family/architecture'")
        for name, allowed in (("dtype", DTYPES), ("mode", MODES), ("execution", EXECUTIONS), ("attn", ATTN_IMPLS)):
            value = getattr(self, name)
            if value not in allowed:
                raise _bad(name, value, f"expected one of {', '.join(allowed)}")
        for name in ("batch", "size", "steps", "seed"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise _bad(name, value, "expected a non-negative int")
        if self.mode == "steps" and self.steps < 1:
            raise _bad("steps", self.steps, "mode 'steps' needs steps >= 1")
        if self.mode != "steps" and self.steps > 1:
            raise _bad("steps", self.steps, f"mode {self.mode!r} runs at most one step; use mode='steps'")
        for name in KNOBS:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise _bad(name, value, "expected None (the default) or a positive int")

    @property
    def family(self) -> str:
        return self.arch.split("/", 1)[0]

    @property
    def config_id(self) -> str:
        """First 16 hex digits of the SHA-1 of the canonical JSON of the fields it sets."""
        text = json.dumps(self.set_fields(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def set_fields(self) -> dict[str, Any]:
        """``arch`` and every field away from its default: what identifies the config, and all ``from_dict`` needs."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name == "arch" or getattr(self, f.name) != f.default}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ModelConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"ModelConfig.from_dict: unknown fields {unknown} (known: {', '.join(sorted(known))})")
        return cls(**dict(data))

    def replace(self, **changes: Any) -> "ModelConfig":
        data = self.to_dict()
        data.update(changes)
        return type(self).from_dict(data)

    def knobs(self) -> dict[str, int]:
        """The size knobs that are set (not default)."""
        return {k: getattr(self, k) for k in KNOBS if getattr(self, k) is not None}

    def __str__(self) -> str:
        parts = [self.arch, self.dtype, f"b{self.batch}", f"s{self.size}", self.mode if self.mode != "steps" else f"steps{self.steps}", self.execution]
        if self.attn != "default":
            parts.append(f"attn={self.attn}")
        parts += [f"{k}={v}" for k, v in self.knobs().items()]
        if self.seed:
            parts.append(f"seed={self.seed}")
        return " ".join(parts)
