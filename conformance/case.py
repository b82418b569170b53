"""The one Case type that travels from case sources to the results store.

A Case says *what* to run, never where: an op sample, a model configuration
or a user script, with enough data to rebuild it in a fresh process. Its id is
a hash of exactly that data, so the same case has the same id in every run,
shard and build, which is what makes resuming, caching the reference side and
comparing builds possible.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

# op: an OpInfo op x dtype x direction; model: a zoo configuration; script: a migration check of a user's
# script; script-side: one side of such a check (never stored); survey: does a zoo entry build on the CPU.
# distributed: a collective or a parallelism setup on N ranks.
CASE_KINDS = ("op", "model", "script", "script-side", "survey", "distributed")


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    kind: str  # one of CASE_KINDS
    name: str  # op name, model architecture, script path
    # What the name belongs to within its kind: an op's OpInfo variant (``variant_test_name``, mostly ""), a
    # model's family (timm, hf, ...), a distributed case's suite, a script's convention, a survey's probe.
    category: str = ""
    dtype: str = ""
    mode: str = ""  # forward / backward, eval / train / steps
    config: dict = field(default_factory=dict)  # everything else needed to rebuild it (JSON-able)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in CASE_KINDS:
            raise ValueError(f"kind={self.kind!r} (type=str): expected one of {', '.join(CASE_KINDS)}")

    @property
    def id(self) -> str:
        # Positional: the fields' names are not hashed (``category`` was ``family``: same ids).
        payload = canonical_json(
            [self.kind, self.name, self.category, self.dtype, self.mode, self.config, self.seed]
        )
        return hashlib.sha1(payload.encode()).hexdigest()[:16]

    @property
    def title(self) -> str:
        """A readable name, e.g. ``op:nn.functional.gelu[float32,backward]#3``."""
        parts = [p for p in (self.dtype, self.mode) if p]
        label = f"{self.kind}:{self.name}"
        if self.category:
            label += f".{self.category}"
        if parts:
            label += f"[{','.join(parts)}]"
        inputs = self.config.get("inputs") or (self.config.get("source") if self.config.get("source") not in
                                                 (None, "opinfo") else None)
        if inputs and self.kind == "op":
            label += f"{{{inputs}}}"
        sample = self.config.get("sample")
        if sample is not None:
            label += f"#{sample}"
        return label

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "name": self.name,
            "category": self.category,
            "dtype": self.dtype,
            "mode": self.mode,
            "config": self.config,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(
            kind=d["kind"],
            name=d["name"],
            category=d.get("category", d.get("family", "")),  # "family" in dicts written before the rename
            dtype=d.get("dtype", ""),
            mode=d.get("mode", ""),
            config=dict(d.get("config", {})),
            seed=int(d.get("seed", 0)),
        )


def shard(cases: list[Case], index: int, count: int) -> list[Case]:
    """Shard ``index`` of ``count`` (1-based), split by case id so shards stay stable."""
    if count < 1 or not 1 <= index <= count:
        raise ValueError(f"shard={index}/{count}: expected i/N with 1 <= i <= N")
    return [c for c in cases if int(c.id, 16) % count == index - 1]


def parse_shard(text: str) -> tuple[int, int]:
    index, sep, count = text.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected i/N, e.g. 1/4") from None
    if not sep or n < 1 or not 1 <= i <= n:
        raise ValueError(f"--shard {text!r}: expected i/N with 1 <= i <= N")
    return i, n
