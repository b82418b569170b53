"""Cache of reference-side results, keyed by (case id, torch version, reference).

The reference (CPU, plus its float64 golden) does not change between backend
builds, so a second build's run executes only the target side. Entries are
nested Python values of tensors, numbers, strings, lists, tuples and dicts,
stored with ``torch.save`` and read back with ``weights_only=True`` (never
unpickling arbitrary objects). Worker processes share one SQLite file.
"""

from __future__ import annotations

import io
import json
import sqlite3
import time
from typing import Any

import torch

SCHEMA = """
CREATE TABLE IF NOT EXISTS reference_cache (
    case_id TEXT NOT NULL,
    torch_version TEXT NOT NULL,
    reference TEXT NOT NULL,
    payload BLOB NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (case_id, torch_version, reference)
)
"""


class Uncacheable(TypeError):
    pass


def _encode(value: Any, tensors: list[torch.Tensor]):
    if isinstance(value, torch.Tensor):
        tensors.append(value.detach().cpu().clone().contiguous() if value.layout == torch.strided else value.detach().cpu())
        return {"__t": len(tensors) - 1}
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"__f": repr(value)}
    if isinstance(value, complex):
        return {"__c": [repr(value.real), repr(value.imag)]}
    if isinstance(value, torch.dtype):
        return {"__dtype": str(value)}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return {"__tuple": [_encode(v, tensors) for v in value]}  # named tuples come back as tuples
    if isinstance(value, tuple):
        return {"__tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__dict": {k: _encode(v, tensors) for k, v in value.items()}}
    raise Uncacheable(f"cannot cache a {type(value).__name__}")


def _decode(node: Any, tensors: list[torch.Tensor]):
    if isinstance(node, list):
        return [_decode(v, tensors) for v in node]
    if isinstance(node, dict):
        if "__t" in node:
            return tensors[node["__t"]]
        if "__f" in node:
            return float(node["__f"])
        if "__c" in node:
            return complex(float(node["__c"][0]), float(node["__c"][1]))
        if "__dtype" in node:
            return getattr(torch, node["__dtype"].removeprefix("torch."))
        if "__tuple" in node:
            return tuple(_decode(v, tensors) for v in node["__tuple"])
        if "__dict" in node:
            return {k: _decode(v, tensors) for k, v in node["__dict"].items()}
    return node


def pack(value: Any) -> bytes:
    tensors: list[torch.Tensor] = []
    structure = json.dumps(_encode(value, tensors))
    buffer = io.BytesIO()
    torch.save({"structure": structure, "tensors": tensors}, buffer)
    return buffer.getvalue()


def unpack(payload: bytes) -> Any:
    data = torch.load(io.BytesIO(payload), weights_only=True)
    return _decode(json.loads(data["structure"]), data["tensors"])


class ReferenceCache:
    def __init__(self, path: str, *, reference: str) -> None:
        self.path = path
        self.reference = reference
        self.torch_version = torch.__version__
        self._conn = sqlite3.connect(path, timeout=60)
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA busy_timeout=60000")
        self._conn.execute(SCHEMA)
        self._conn.commit()

    def get(self, case_id: str) -> Any | None:
        row = self._conn.execute(
            "SELECT payload FROM reference_cache WHERE case_id=? AND torch_version=? AND reference=?",
            (case_id, self.torch_version, self.reference),
        ).fetchone()
        if row is None:
            return None
        try:
            return unpack(row[0])
        except Exception:  # noqa: BLE001 - a damaged entry is recomputed, not trusted
            return None

    def put(self, case_id: str, value: Any) -> bool:
        try:
            payload = pack(value)
        except Uncacheable:
            return False
        for attempt in range(5):
            try:
                with self._conn:
                    self._conn.execute(
                        "INSERT OR REPLACE INTO reference_cache VALUES (?, ?, ?, ?, ?)",
                        (case_id, self.torch_version, self.reference, payload, time.time()),
                    )
                return True
            except sqlite3.OperationalError:
                time.sleep(0.2 * (attempt + 1))
        return False
