"""The shipped buildability status: which architectures build and train, and why not.

``model_zoo/data/arch_status.json`` is written by ``python -m model_zoo.survey``:
for every registered entry, whether it builds and runs a float32 train
forward+backward on CPU at its default tiny size (twice, bitwise equal), the
failure reason when it does not, and how long building and running took.
The sampler reads it to cover every buildable architecture; dashboards read
it to list failures per architecture.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

STATUS_PATH = Path(__file__).parent / "data" / "arch_status.json"
PASSING = "ok"
STATUSES = ("ok", "error", "unsupported", "nondeterministic", "timeout", "crash", "memory")


def load_status(path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """Entry name -> record (``status``, ``reason``, ``build_s``, ``run_s`` ...); empty when no file."""
    return dict(_load(str(path or STATUS_PATH)))


@lru_cache(maxsize=4)
def _load(path: str) -> dict[str, dict[str, Any]]:
    try:
        with open(path) as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    return data.get("archs", {})


def is_buildable(name: str, status: dict[str, dict[str, Any]], *, unknown: bool = True) -> bool:
    """True when the survey passed ``name``; ``unknown`` answers for names it has not seen."""
    record = status.get(name)
    if record is None:
        return unknown
    return record.get("status") == PASSING
