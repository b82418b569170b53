"""The op catalogue: what selecting op cases needs to know of each OpInfo entry, kept per PyTorch build.

Selecting cases needs little of an OpInfo entry: its name, the dtypes it supports on the CPU, which of them
have a backward, whether it is element-wise, and which dtypes each input strategy gives a case. Getting that
from the entries themselves means importing OpInfo's database (about 4 s) and, for the strategies, probing
the ops' samples (10 s more for all of op_db). Every ``neuron-conformance ops`` paid that in its own process
before its workers loaded the database again to run the samples; so did ``--list`` and a mistyped op name.

So the catalogue is built once from op_db (sources.py) and kept as a JSON file, which later selections read. The
file's name holds a digest of torch's version and of every file of this package (the strategies' dtype rules,
the per-op rules, this module), so a new torch or a changed strategy builds a new catalogue and no stale one
is ever read. It lives in ``$NEURON_VALIDATE_CACHE`` (default: ``$XDG_CACHE_HOME/neuron-validate``, else
``~/.cache/neuron-validate``, else a folder of the user's in the temporary folder). A file that cannot be read
is built again; a folder that cannot be written costs each command the build, never its selection.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from filelock import FileLock

CACHE_ENV = "NEURON_VALIDATE_CACHE"
PACKAGE = Path(__file__).parent
KEEP = 4  # catalogues kept in the folder: two checkouts or torch builds side by side each keep theirs


@dataclass(frozen=True, slots=True, kw_only=True)
class OpEntry:
    """One OpInfo entry, as case selection sees it."""

    key: str  # ``name`` or ``name.variant``, unique across op_db
    name: str
    variant: str
    dtypes: tuple[str, ...]  # supported on the CPU, sorted by name
    backward_dtypes: tuple[str, ...]  # of those, the ones a backward case runs in
    elementwise: str | None  # "unary", "binary" or None
    strategy_dtypes: tuple[tuple[str, str, tuple[str, ...]], ...]  # (strategy, direction, dtypes that get a case)

    def dtypes_for(self, strategy: str, direction: str) -> tuple[str, ...]:
        for name, way, chosen in self.strategy_dtypes:
            if name == strategy and way == direction:
                return chosen
        return ()

    @classmethod
    def from_json(cls, data: dict) -> OpEntry:
        return cls(
            key=data["key"], name=data["name"], variant=data["variant"], dtypes=tuple(data["dtypes"]),
            backward_dtypes=tuple(data["backward_dtypes"]), elementwise=data["elementwise"],
            strategy_dtypes=tuple((s, d, tuple(chosen)) for s, d, chosen in data["strategy_dtypes"]),
        )


def cache_folders() -> list[Path]:
    """Where catalogues are kept: ``$NEURON_VALIDATE_CACHE`` alone when set; else the user's cache folder, and a
    folder of the user's in the temporary folder for a home that cannot be written (a CI container's)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return [Path(explicit)]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "neuron-validate"
    return [home, Path(tempfile.gettempdir()) / f"neuron-validate-{os.getuid()}"]


def catalogue_name() -> str:
    """The catalogue's file name for this torch and this version of op_tests."""
    digest = hashlib.sha256(f"{torch.__version__} {torch.version.git_version}".encode())
    for path in sorted(PACKAGE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(PACKAGE)).encode())
            digest.update(path.read_bytes())
    return f"op-catalogue-{digest.hexdigest()[:16]}.json"


def load_or_build(build: Callable[[], list[OpEntry]]) -> list[OpEntry]:
    """The kept catalogue, or ``build()``'s, kept for the next command in the first folder that takes it."""
    name = catalogue_name()
    built = None
    for folder in cache_folders():
        path = folder / name
        kept = _read(path)
        if kept is not None:
            return kept
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # Commands started together (a CI job's shards, a test run's workers) build it once between them.
            with FileLock(str(path.with_name(path.name + ".lock")), timeout=600):
                kept = _read(path)
                if kept is not None:
                    return kept
                built = build() if built is None else built
                _keep(path, built)
                return built
        except OSError:  # a folder that cannot be written, or a lock held too long: the next folder
            continue
    return build() if built is None else built


def _read(path: Path) -> list[OpEntry] | None:
    try:
        return [OpEntry.from_json(e) for e in json.loads(path.read_text())["ops"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None  # not built yet, or unreadable: build it


def _keep(path: Path, entries: list[OpEntry]) -> None:
    """Writes the catalogue whole or not at all (a temporary file renamed), so that a reader never sees half."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    try:
        partial.write_text(json.dumps({"torch": torch.__version__, "ops": [asdict(e) for e in entries]}))
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    _prune(path)


def _prune(path: Path) -> None:
    """Removes all but the ``KEEP`` newest catalogues beside ``path`` (older torch builds or sources: 0.6 MB each)."""
    try:
        others = sorted((p for p in path.parent.glob("op-catalogue-*.json") if p != path),
                        key=lambda p: p.stat().st_mtime, reverse=True)
        for old in others[KEEP - 1:]:
            old.unlink(missing_ok=True)
            old.with_name(old.name + ".lock").unlink(missing_ok=True)
    except OSError:
        pass  # another command pruned them first
