"""Expectations: a backend's known failures, each with a reason and an issue link.

A backend team keeps one TOML file per backend next to its CI configuration::

    backend = "neuron"                  # optional: refuse to apply this file to another target

    [[failure]]
    name = "nn.functional.gelu"         # globs over the case's kind, category, name, dtype, mode
    dtype = "bfloat16"
    reason = "tanh approximation on the Scalar Engine is off by 2 ulp"
    issue = "https://github.com/aws-neuron/aws-neuron-sdk/issues/1323"

    [[failure]]
    id = "d7cdd89cd6584350"             # or one case by its stable id
    reason = "..."
    issue = "https://..."

A failing case that an entry matches is ``xfail`` and never a regression; a
passing one is ``xpass``, which says the entry can go. Fields are matched
with shell globs on purpose, not on titles: titles contain ``[`` and ``]``,
which globs would read as character classes.
"""

from __future__ import annotations

import difflib
import fnmatch
import sys
from dataclasses import dataclass
from pathlib import Path

from conformance.case import Case

SELECTORS = ("kind", "category", "name", "dtype", "mode")  # category: an op's OpInfo variant, a model's family, ...
OLD_NAMES = {"family": "category"}  # selectors as files written before a rename call them
KEYS = ("id", *SELECTORS, "reason", "issue")
TOP_KEYS = ("backend", "failure")


class ExpectationsError(ValueError):
    """An expectations file that cannot be used; the message is one line and names the file and entry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class KnownFailure:
    reason: str
    issue: str
    id: str = ""
    kind: str = "*"
    category: str = "*"
    name: str = "*"
    dtype: str = "*"
    mode: str = "*"
    index: int = 0  # position in the file, 1-based, for messages

    def matches(self, case: Case, case_id: str | None = None) -> bool:
        if self.id:
            return (case_id or case.id) == self.id
        return all(fnmatch.fnmatchcase(getattr(case, f), getattr(self, f)) for f in SELECTORS)

    def describe(self) -> str:
        if self.id:
            return f"id={self.id}"
        return " ".join(f"{f}={getattr(self, f)}" for f in SELECTORS if getattr(self, f) != "*") or "all cases"


@dataclass(frozen=True, slots=True, kw_only=True)
class Expectations:
    path: str
    backend: str = ""
    failures: tuple[KnownFailure, ...] = ()

    def match(self, case: Case, case_id: str | None = None) -> KnownFailure | None:
        """The first entry that matches the case, or None."""
        for entry in self.failures:
            if entry.matches(case, case_id):
                return entry
        return None

    def check_backend(self, target: str) -> None:
        device = target.partition(":")[0]
        if self.backend and self.backend != device:
            raise ExpectationsError(f"{self.path}: expectations for backend {self.backend!r} cannot judge a build "
                                    f"of target {target!r}")


def _load_toml(path: Path) -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib
        except ImportError:
            raise ExpectationsError(f"{path}: reading TOML needs Python 3.11 or the tomli package") from None
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except OSError as exc:
        raise ExpectationsError(f"--expectations {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(f"{path}: not valid TOML: {exc}") from None


def _unknown(key: str, known: tuple[str, ...], where: str) -> ExpectationsError:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return ExpectationsError(f"{where}: unknown key {key!r}{hint} (keys: {', '.join(known)})")


def load_expectations(path: str | Path) -> Expectations:
    path = Path(path)
    data = _load_toml(path)
    for key in data:
        if key not in TOP_KEYS:
            raise _unknown(key, TOP_KEYS, str(path))
    backend = data.get("backend", "")
    if not isinstance(backend, str):
        raise ExpectationsError(f"{path}: backend={backend!r} (type={type(backend).__name__}): expected a device name")
    entries = data.get("failure", [])
    if not isinstance(entries, list):
        raise ExpectationsError(f"{path}: 'failure' must be an array of tables: write [[failure]] per known failure")
    failures = []
    for i, entry in enumerate(entries, 1):
        where = f"{path}: failure {i}"
        for key, value in entry.items():
            if key not in KEYS and key not in OLD_NAMES:
                raise _unknown(key, KEYS, where)
            if not isinstance(value, str):
                raise ExpectationsError(f"{where}: {key}={value!r} (type={type(value).__name__}): expected a string")
        for key in ("reason", "issue"):
            if not entry.get(key, "").strip():
                raise ExpectationsError(f"{where}: missing {key!r} (every known failure needs a reason and an issue link)")
        if not entry["issue"].startswith(("https://", "http://")):
            raise ExpectationsError(f"{where}: issue={entry['issue']!r} (type=str): expected a link, "
                                    "e.g. https://github.com/OWNER/REPO/issues/N")
        if any(old in entry and new in entry for old, new in OLD_NAMES.items()):
            raise ExpectationsError(f"{where}: give category, not both category and its old name family")
        entry = {OLD_NAMES.get(k, k): v for k, v in entry.items()}
        if not any(k in entry for k in ("id", *SELECTORS)):
            raise ExpectationsError(f"{where}: selects nothing: give id or at least one of {', '.join(SELECTORS)}")
        if "id" in entry and any(k in entry for k in SELECTORS):
            raise ExpectationsError(f"{where}: give either id or field globs, not both")
        failures.append(KnownFailure(index=i, **{k: v.strip() for k, v in entry.items()}))
    return Expectations(path=str(path), backend=backend, failures=tuple(failures))
