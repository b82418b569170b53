"""Cache of reference-side results, keyed by (case id, torch version, reference and its threads).

The reference (CPU, plus its float64 golden) does not change between backend
builds, so a second build's run executes only the target side; an entry may
also hold the case's inputs, so that run does not generate them again. Op
cases (op_tests/execute.py) and model cases (model_zoo/execute.py: a
configuration's outputs, loss and gradients, with a fingerprint of its
weights and inputs) share it; a case id holds the config and its seed. Entries are
nested Python values of tensors, numbers, strings, lists, tuples and dicts,
stored with ``torch.save`` and read back with ``weights_only=True`` (never
unpickling arbitrary objects). Worker processes share one SQLite file.

Size is bounded: an entry over ``MAX_ENTRY_BYTES`` is not cached (the ops
whose samples are that large are a few; recomputing them is cheaper than
storing them), and nothing is added once the file exceeds ``max_bytes``
(default ``MAX_CACHE_BYTES``). Without the bounds a full sweep's cache
grew past 30 GB.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

import torch

from conformance.serialize import Unserializable, pack, unpack
from results.store import use_wal

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


MAX_ENTRY_BYTES = 1 << 20
MAX_CACHE_BYTES = 2 << 30


def tensor_bytes(value: Any) -> int:
    """The bytes of the tensors' values in a nested value: what its packed size is, give or take the layout."""
    from torch.utils._pytree import tree_leaves

    return sum(t.numel() * t.element_size() for t in tree_leaves(value) if isinstance(t, torch.Tensor))


def reference_key(reference: str, threads: int) -> str:
    """What the reference is, for the cache: its spec and its intra-op threads (a reduction split over
    more threads can round differently)."""
    return f"{reference}/threads={threads}"


class ReferenceCache:
    def __init__(self, path: str, *, reference: str, max_bytes: int = MAX_CACHE_BYTES) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.reference = reference
        self.torch_version = torch.__version__
        import os

        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)  # a node-local folder made on first use
        self._conn = sqlite3.connect(path, timeout=60)
        self._conn.execute("PRAGMA busy_timeout=60000")
        use_wal(self._conn)  # workers start together and race to create the file
        self._conn.execute(SCHEMA)
        self._conn.commit()

    def _size(self) -> int:
        import os

        try:
            return os.path.getsize(self.path) + os.path.getsize(self.path + "-wal") \
                if os.path.exists(self.path + "-wal") else os.path.getsize(self.path)
        except OSError:
            return 0

    def get(self, case_id: str) -> Any | None:
        """The entry, or None; tensors that required grad when stored (a backward case's inputs) still do."""
        row = self._conn.execute(
            "SELECT payload FROM reference_cache WHERE case_id=? AND torch_version=? AND reference=?",
            (case_id, self.torch_version, self.reference),
        ).fetchone()
        if row is None:
            return None
        try:
            return unpack(row[0], requires_grad=True)
        except Exception:  # noqa: BLE001 - a damaged entry is recomputed, not trusted
            return None

    def put(self, case_id: str, value: Any, *, max_entry_bytes: int = MAX_ENTRY_BYTES) -> bool:
        """Stores an entry; False when it is not stored (unserializable, larger than ``max_entry_bytes``, or the
        cache is full). A kind of case whose entries are larger (a model's gradients) passes its own bound."""
        if tensor_bytes(value) > max_entry_bytes or self._size() > self.max_bytes:
            return False  # decided before packing: serialising a large entry only to drop it costs as much as a run
        try:
            payload = pack(value)
        except Unserializable:
            return False
        if len(payload) > max_entry_bytes:
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
