"""The zoo's exceptions, each with a one-line message.

The harness turns these into outcomes: a ``ModelBuildError`` becomes
``unsupported`` (or ``error`` where the zoo expected the build to work), so
the message must say why in one line, the way a dashboard cell can show it.
"""

from __future__ import annotations


class ModelZooError(Exception):
    """Base class; every zoo error message is a single line."""


class ModelBuildError(ModelZooError):
    """An architecture that cannot be built, or an axis value it does not support."""


class UnknownModelError(ModelBuildError, KeyError):
    """A registry name that is not registered; the message lists the closest names."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DuplicateModelError(ModelZooError, ValueError):
    """A second registration under a name already taken (timm warns; we refuse)."""


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of message``, cut to ``limit`` characters."""
    text = [t.strip() for t in str(exc).strip().splitlines() if t.strip()]
    first = text[0] if text else ""
    if first.endswith(":") and len(text) > 1:  # "Validation error for field 'x':" says why on the next line
        first = f"{first} {text[1]}"
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
