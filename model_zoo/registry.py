"""The model registry: decorator registration, wildcard selection, strict names.

Entries are named ``family/architecture`` (``timm/resnet18``, ``hf/gpt2``);
a task head of a multi-head family adds ``:task`` (``hf/gpt2:causal_lm``),
and such a *variant* points back at its primary entry (``variant_of``). Two
decorators fill the registry:

* ``@register_model(name, ...)`` on a builder function, for one-off models
  (the built-in families);
* ``@register_family(family)`` on a function that yields many entries, for
  families listed from an installed package (timm, transformers, diffusers).
  Such a function runs once, the first time the registry is read, and reads
  cached name lists so that listing the zoo imports no model package.

Unlike timm's registry, a duplicate name raises ``DuplicateModelError`` and an
unknown name raises ``UnknownModelError`` listing the closest names.

A renamed architecture keeps its old name as an alias (``register_alias(old,
new)``, timm's deprecation map): reading the old name gives the new entry, a
config under the old name resolves to the new one, and the gate finds a
baseline's results stored under the old name (``current_name``). An alias is
never listed, and may not shadow a registered name.

The modules that register families are found through the entry point group
``neuron_validate.model_families`` (pyproject.toml), the way pytest finds its
plugins: the registry never imports them by name, they import the registry,
and another package can add a family of its own.
"""

from __future__ import annotations

import difflib
import fnmatch
import importlib
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from .config import ATTN_IMPLS, DTYPES, EXECUTIONS, KNOBS, MODES, ModelConfig
from .errors import DuplicateModelError, ModelBuildError, UnknownModelError

if TYPE_CHECKING:
    from .built import BuiltModel

Builder = Callable[[ModelConfig, "ModelEntry"], "BuiltModel"]

# The entry point group of the modules whose import registers a family; imported on first use.
FAMILY_ENTRY_POINTS = "neuron_validate.model_families"


def family_modules() -> tuple[str, ...]:
    """The installed family modules, in their entry points' order."""
    from importlib.metadata import entry_points

    return tuple(ep.value for ep in entry_points(group=FAMILY_ENTRY_POINTS))


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    """One registered architecture (or task variant) and the axis values it supports.

    ``sizes`` and ``batches`` list the values the configuration space takes,
    the default (tiny) one first. ``knob_values`` maps each size knob the
    architecture has to the non-default values the space tries; a knob that
    is absent is not supported. ``unsupported`` lists combinations of axis
    values the architecture cannot run, each with its reason (FlexAttention
    has no CPU backward: ``({"attn": ("flex",), "mode": ("train", "steps")},
    "...")``); the space leaves them out and ``check`` refuses them. ``meta`` holds what the family's builder needs
    (a timm kwargs dict, an HF model type and task) and is read-only.
    """

    name: str
    modality: str
    builder: Builder = field(repr=False, compare=False)
    tasks: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = DTYPES
    modes: tuple[str, ...] = MODES
    executions: tuple[str, ...] = EXECUTIONS
    attn: tuple[str, ...] = ("default",)
    sizes: tuple[int, ...] = (16,)
    batches: tuple[int, ...] = (2, 1)
    steps: int = 3
    knob_values: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    variant_of: str | None = None
    unsupported: tuple[tuple[Mapping[str, tuple[Any, ...]], str], ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        family, sep, arch = self.name.partition("/")
        if not sep or not family or not arch:
            raise ValueError(f"name={self.name!r} (type=str): expected 'family/architecture'")
        for label, values, allowed in (("dtypes", self.dtypes, DTYPES), ("modes", self.modes, MODES),
                                       ("executions", self.executions, EXECUTIONS), ("attn", self.attn, ATTN_IMPLS),
                                       ("knob_values", tuple(self.knob_values), KNOBS)):
            bad = [v for v in values if v not in allowed]
            if bad:
                raise ValueError(f"{label}={values!r} of {self.name}: unknown {bad} (allowed: {', '.join(allowed)})")
        if not self.sizes or not self.batches:
            raise ValueError(f"{self.name}: sizes and batches need at least one value (the default first)")
        object.__setattr__(self, "knob_values", MappingProxyType({k: tuple(v) for k, v in self.knob_values.items()}))
        object.__setattr__(self, "meta", MappingProxyType(dict(self.meta)))

    @property
    def family(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def arch(self) -> str:
        """The part after ``family/``, task included."""
        return self.name.split("/", 1)[1]

    @property
    def architecture(self) -> str:
        """The registry name without the ``:task`` suffix."""
        return self.variant_of or self.name

    @property
    def default_size(self) -> int:
        return self.sizes[0]

    @property
    def default_batch(self) -> int:
        return self.batches[0]

    def check(self, config: ModelConfig) -> None:
        """Raises ``ModelBuildError`` when ``config`` asks for an axis value this entry lacks."""
        for label, value, allowed in (("dtype", config.dtype, self.dtypes), ("mode", config.mode, self.modes),
                                      ("execution", config.execution, self.executions), ("attn", config.attn, self.attn)):
            if value not in allowed:
                raise ModelBuildError(f"{self.name}: {label}={value!r} is not supported (supported: {', '.join(allowed)})")
        for knob, value in config.knobs().items():
            if knob not in self.knob_values:
                have = ", ".join(self.knob_values) or "none"
                raise ModelBuildError(f"{self.name}: no {knob!r} knob (knobs: {have})")
        reason = self.unsupported_reason(config.to_dict())
        if reason:
            raise ModelBuildError(f"{self.name}: not supported: {reason}")

    def unsupported_reason(self, axes: Mapping[str, Any]) -> str | None:
        """The reason ``axes`` (axis name -> value) is an unsupported combination, else None."""
        for rule, reason in self.unsupported:
            if all(axes.get(axis) in values for axis, values in rule.items()):
                return reason
        return None

    def to_summary(self) -> dict[str, Any]:
        """A JSON-ready description for ``--list`` and dashboards."""
        return {
            "name": self.name, "family": self.family, "modality": self.modality, "tasks": list(self.tasks),
            "dtypes": list(self.dtypes), "attn": list(self.attn), "sizes": list(self.sizes),
            "batches": list(self.batches), "knobs": {k: list(v) for k, v in self.knob_values.items()},
            "variant_of": self.variant_of,
        }


class Registry:
    """Names to entries; family loaders run once, on first read."""

    def __init__(self, family_modules: Iterable[str] | Callable[[], Iterable[str]] = ()) -> None:
        """``family_modules``: modules to import before the first read (or a function that names them)."""
        self._entries: dict[str, ModelEntry] = {}
        self._family_loaders: dict[str, Callable[[], Iterable[ModelEntry]]] = {}
        self._family_modules = family_modules
        self._aliases: dict[str, str] = {}  # old name -> the name it was renamed to
        self._loaded = False
        self._loading = False

    # registration -------------------------------------------------------
    def add(self, entry: ModelEntry) -> ModelEntry:
        if entry.name in self._entries:
            raise DuplicateModelError(f"model {entry.name!r} is already registered")
        if entry.name in self._aliases:
            raise DuplicateModelError(f"model {entry.name!r} is an alias of {self._aliases[entry.name]!r}")
        self._entries[entry.name] = entry
        return entry

    def register_alias(self, old: str, new: str) -> None:
        """Records that architecture ``old`` is now ``new``; its task variants (``old:task``) follow."""
        if old in self._aliases:
            raise DuplicateModelError(f"alias {old!r} is already registered (-> {self._aliases[old]!r})")
        if old in self._entries:
            raise DuplicateModelError(f"alias {old!r} would shadow the registered model {old!r}")
        if old == new:
            raise ValueError(f"alias {old!r} -> {new!r}: an alias names another model")
        self._aliases[old] = new

    def register_model(self, name: str, **entry_fields: Any) -> Callable[[Builder], Builder]:
        """Decorator: registers the decorated builder under ``name``."""

        def decorate(builder: Builder) -> Builder:
            self.add(ModelEntry(name=name, builder=builder, **entry_fields))
            return builder

        return decorate

    def register_family(self, family: str) -> Callable[[Callable[[], Iterable[ModelEntry]]], Callable[[], Iterable[ModelEntry]]]:
        """Decorator: the decorated function yields the family's entries, lazily."""

        def decorate(loader: Callable[[], Iterable[ModelEntry]]) -> Callable[[], Iterable[ModelEntry]]:
            if family in self._family_loaders:
                raise DuplicateModelError(f"family {family!r} is already registered")
            self._family_loaders[family] = loader
            if self._loaded:  # registered after the first read: load now
                self._run_loader(family, loader)
            return loader

        return decorate

    def _run_loader(self, family: str, loader: Callable[[], Iterable[ModelEntry]]) -> None:
        for entry in loader():
            if entry.family != family:
                raise ValueError(f"family {family!r} yielded {entry.name!r} from another family")
            self.add(entry)

    def _ensure_loaded(self) -> None:
        if self._loaded or self._loading:
            return
        self._loading = True
        try:
            modules = self._family_modules() if callable(self._family_modules) else self._family_modules
            for module in modules:
                importlib.import_module(module)
            for family, loader in self._family_loaders.items():
                self._run_loader(family, loader)
            self._loaded = True
        finally:
            self._loading = False

    # reading ------------------------------------------------------------
    def names(self) -> list[str]:
        self._ensure_loaded()
        return sorted(self._entries)

    def families(self) -> list[str]:
        return sorted({name.split("/", 1)[0] for name in self.names()})

    def list_models(self, patterns: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
                    *, primary_only: bool = False) -> list[str]:
        """Names matching any of ``patterns`` (fnmatch wildcards) and none of ``exclude``.

        ``None`` patterns select everything; ``primary_only`` drops task variants.
        """
        names = self.names()
        include = [patterns] if isinstance(patterns, str) else list(patterns or [])
        drop = [exclude] if isinstance(exclude, str) else list(exclude or [])
        if include:
            names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in include)]
        if drop:
            names = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in drop)]
        if primary_only:
            names = [n for n in names if self._entries[n].variant_of is None]
        return names

    def entries(self, patterns: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None,
                *, families: Iterable[str] | None = None, primary_only: bool = False) -> Iterator[ModelEntry]:
        wanted = set(families) if families is not None else None
        for name in self.list_models(patterns, exclude, primary_only=primary_only):
            entry = self._entries[name]
            if wanted is None or entry.family in wanted:
                yield entry

    def current_name(self, name: str) -> str:
        """``name`` with its aliases followed (``old:task`` -> ``new:task``); any other name as it is."""
        self._ensure_loaded()
        seen = [name]
        while name not in self._entries:
            base, sep, task = name.partition(":")
            if name in self._aliases:
                name = self._aliases[name]
            elif base in self._aliases:
                name = self._aliases[base] + sep + task
            else:
                break
            if name in seen:
                raise ValueError(f"aliases in a circle: {' -> '.join([*seen, name])}")
            seen.append(name)
        return name

    def get_entry(self, name: str) -> ModelEntry:
        try:
            return self._entries[self.current_name(name)]
        except KeyError:
            raise UnknownModelError(self._unknown_message(name)) from None

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.current_name(name) in self._entries

    def __len__(self) -> int:
        return len(self.names())

    def _unknown_message(self, name: str) -> str:
        names = list(self._entries)
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.6)
        if len(close) < 5:  # also try the bare architecture against bare architectures
            bare = {n.split("/", 1)[-1]: n for n in names}
            for hit in difflib.get_close_matches(name.split("/", 1)[-1], list(bare), n=5, cutoff=0.6):
                if bare[hit] not in close:
                    close.append(bare[hit])
        hint = f"closest: {', '.join(close[:5])}" if close else f"no close match among {len(names)} models (see --list)"
        return f"unknown model {name!r}; {hint}"

    def resolve(self, config: ModelConfig) -> ModelConfig:
        """``config`` under the architecture's current name, with its default batch and size filled in from the entry."""
        entry = self.get_entry(config.arch)
        changes: dict[str, Any] = {"arch": entry.name} if entry.name != config.arch else {}
        if config.batch == 0:
            changes["batch"] = entry.default_batch
        if config.size == 0:
            changes["size"] = entry.default_size
        return replace(config, **changes) if changes else config


REGISTRY = Registry(family_modules)
register_model = REGISTRY.register_model
register_family = REGISTRY.register_family
register_alias = REGISTRY.register_alias
current_name = REGISTRY.current_name
list_models = REGISTRY.list_models
get_entry = REGISTRY.get_entry
resolve = REGISTRY.resolve


def families() -> list[str]:
    return REGISTRY.families()


def entries(patterns: str | Iterable[str] | None = None, exclude: str | Iterable[str] | None = None, *,
            families: Iterable[str] | None = None, primary_only: bool = False) -> Iterator[ModelEntry]:
    return REGISTRY.entries(patterns, exclude, families=families, primary_only=primary_only)
