"""Targets: where a case runs, and the backend adapter that runs it there.

A target spec string has the form ``DEVICE[:MODE]``: ``cpu``, ``cpu:compile``,
``cuda``, ``neuron``, ``neuron:compile``, or any PrivateUse1 device name. The
reference and the target are both Targets; the runner never asks which is
which. Each Target knows its device (values move there with
``diff.sides.to_device``), how to synchronise and compile, describe itself (``label``, e.g. "neuron (emulated)")
and the environment that reproduces its results (``manifest``), and, where the
backend offers it, which ATen ops ran natively and which ran on the host.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import platform
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator

from .settings import BACKEND_MODULES_ENV

MODES = ("eager", "compile")
KNOWN_DEVICES = ("cpu", "cuda", "neuron")
_ENV_PREFIXES = ("NEURON_", "TORCH_NEURONX_", "XLA_", "NEURON_VALIDATE_", "TORCH_DEVICE_BACKEND_AUTOLOAD", "CUDA_")


class TargetError(ValueError):
    """A target that cannot be used here; the message is one line."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetSpec:
    device: str
    mode: str = "eager"

    @classmethod
    def parse(cls, text: str) -> "TargetSpec":
        text = (text or "").strip()
        if not text:
            raise TargetError("empty target spec: expected DEVICE[:MODE], e.g. neuron or neuron:compile")
        device, _, mode = text.partition(":")
        mode = mode or "eager"
        if mode not in MODES:
            raise TargetError(f"target {text!r}: unknown mode {mode!r} (modes: {', '.join(MODES)})")
        if not device.isidentifier():
            raise TargetError(f"target {text!r}: {device!r} is not a device name")
        return cls(device=device, mode=mode)

    def __str__(self) -> str:
        return self.device if self.mode == "eager" else f"{self.device}:{self.mode}"


# The real torch_neuronx runs strict under the harness: by default it re-runs a kernel that fails at execution
# on the CPU, and runs a graph that fails to compile eagerly, both silently; a conformance run must see both
# failures. A user who sets either variable keeps their value; the manifest records what was in force.
STRICT_NEURONX_ENV = {
    "TORCH_NEURONX_FALLBACK_ONLY_FOR_UNIMPLEMENTED_OPS": "1",
    "TORCH_NEURONX_DISABLE_FALLBACK_EXECUTION": "1",
}


def apply_strict_neuronx_env() -> None:
    """Sets the strict-mode variables (unless set) before torch_neuronx is imported, here and in children."""
    for key, value in STRICT_NEURONX_ENV.items():
        os.environ.setdefault(key, value)


def graph_inputs(example_inputs) -> dict:
    """The shapes and dtypes of the tensors dynamo hands a backend with a graph.

    A static-shape compiler (Neuron's) builds one graph per such signature, so these are what the
    recompilation check compares; any backend is handed them, which keeps the check backend-neutral.
    A symbolic dim (dynamic=True) is kept as its name, never specialised by reading it.
    """
    import torch

    tensors = [v for v in example_inputs if isinstance(v, torch.Tensor)]
    return {"shapes": [[s if isinstance(s, int) else str(s) for s in t.shape] for t in tensors],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors]}


class GraphCounter:
    """A torch.compile backend that records the graphs it is handed and passes them to the real one."""

    def __init__(self, backend, on_graph: Callable | None = None) -> None:
        """``backend``: a backend's name, or a backend itself; ``on_graph(gm, inputs)`` is told of each graph
        (``inputs``: its :func:`graph_inputs`)."""
        self.backend = backend
        self.seen: list[dict] = []  # graph_inputs of each graph, in the order compiled
        self.on_graph = on_graph

    @property
    def graphs(self) -> int:
        return len(self.seen)

    def __call__(self, gm, example_inputs, **kwargs):
        import torch._dynamo

        self.seen.append(graph_inputs(example_inputs))
        if self.on_graph is not None:
            self.on_graph(gm, self.seen[-1])
        backend = torch._dynamo.lookup_backend(self.backend) if isinstance(self.backend, str) else self.backend
        return backend(gm, example_inputs, **kwargs)


@dataclass(slots=True)
class Compiled:
    """A compiled callable and the count of graphs compiled for it (see Target.compile)."""

    fn: Callable
    counter: GraphCounter

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    @property
    def graphs(self) -> int:
        return self.counter.graphs


@dataclass(slots=True)
class CompiledCalls:
    """Calls compiled in one graph built without dynamo (see Target.compile_calls); calling it runs them."""

    graph: Any  # conformance.call_graph.CallGraph
    fn: Callable
    counter: GraphCounter

    def __call__(self) -> list:
        """Each call's output, computed by the compiled graph."""
        return self.graph.unflatten(self.fn(*self.graph.inputs))

    @property
    def graphs(self) -> int:
        return self.counter.graphs


def ran_eagerly(runner) -> bool:
    """Whether a callable that was to be compiled ran without compiling a single graph."""
    return isinstance(runner, Compiled) and runner.graphs == 0


EAGER_UNDER_COMPILE = ("the compile target compiled no graph: dynamo ran this eagerly, so the compiler was not "
                       "tested")


@dataclass(frozen=True, slots=True)
class OpTrace:
    """ATen ops seen on the device during a tracked region."""

    executed: tuple[str, ...]
    fallback: tuple[str, ...]


@dataclass(slots=True)
class OpTracker:
    """Filled in when a tracked region ends; ``trace`` is None where the backend cannot track."""

    trace: OpTrace | None = None
    # What the backend had recorded when a region inside this one cleared its record to start its own.
    held: tuple[set, set] = field(default_factory=lambda: (set(), set()))


# The tracked regions open on each tracking module (by id), outermost first: regions nest (the migration
# check's eval-mode call inside the functions convention's tracked comparison), and the backend keeps one record.
_OPEN_REGIONS: dict[int, list[OpTracker]] = {}


def import_backend_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Imports modules that register a backend (``--backend-module``)."""
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - any failure is the user's module failing to import
            raise TargetError(f"--backend-module {name}: import failed: {type(exc).__name__}: {exc}") from None


@dataclass(kw_only=True)
class Target:
    """A spec bound to a backend adapter. Build with :func:`resolve_target`."""

    spec: TargetSpec
    kind: str  # cpu | cuda | neuron | neuron-emulated | privateuse1
    label: str
    _tracking_module: Any = field(default=None, repr=False)

    # ---------------------------------------------------------------- device
    @property
    def device(self):
        import torch

        return torch.device(self.spec.device)

    @property
    def is_emulated(self) -> bool:
        return self.kind == "neuron-emulated"

    @property
    def compiles(self) -> bool:
        return self.spec.mode == "compile"

    def in_mode(self, mode: str) -> "Target":
        """This target on the same device and backend, run in ``mode`` (eager or compile)."""
        return replace(self, spec=replace(self.spec, mode=mode))

    @property
    def own_random_stream(self):
        """The device module whose generator draws the target's random numbers, when they differ from the
        CPU's for the same seed (a real accelerator; the emulated device under a profile with its own
        stream); None when they match the CPU's draws."""
        import torch

        if self.kind == "cpu":
            return None
        if self.is_emulated:
            import emulator

            if not emulator.profile().independent_rng:
                return None
        module = getattr(torch, self.spec.device, None)
        return module if module is not None and hasattr(module, "get_rng_state") else None

    def synchronize(self) -> None:
        import torch

        if self.kind == "cuda":
            torch.cuda.synchronize()
        elif self.kind != "cpu":
            module = getattr(torch, self.spec.device, None)
            if module is not None and hasattr(module, "synchronize"):
                module.synchronize()

    def peak_memory(self, reset: bool = False) -> int | None:
        """Peak bytes allocated on the device since the last reset (None where the backend cannot tell)."""
        import torch

        module = getattr(torch, self.spec.device, None) if self.kind != "cpu" else None
        if module is None or not hasattr(module, "max_memory_allocated"):
            return None
        if reset and hasattr(module, "reset_peak_memory_stats"):
            module.reset_peak_memory_stats()
            return None
        return int(module.max_memory_allocated())

    def compile_backend(self) -> str:
        """The torch.compile backend for this device."""
        if self.kind in ("neuron", "neuron-emulated"):
            return "neuron"
        if self.kind in ("cpu", "cuda"):
            return "inductor"
        return "aot_eager"

    def prepare(self, fn: Callable) -> Callable:
        """The callable as this target runs it: compiled (see :meth:`compile`) in compile mode."""
        return self.compile(fn) if self.compiles else fn

    def compile(self, fn: Callable, *, fullgraph: bool = False) -> "Compiled":
        """``fn`` compiled afresh with this target's backend, counting the graphs it compiles.

        Each call starts from a new dynamo state: dynamo keys its caches by
        code object and, past its recompile limit (8), silently runs a
        function eagerly; one harness function shared by many samples or
        models (a per-sample lambda, one model class) would reach it and stop
        testing the compiler. ``Compiled.graphs`` then tells whether
        anything was compiled at all: none means the call ran eagerly.
        ``fullgraph``: a graph break raises instead (every op of ``fn`` is then in the one graph).
        """
        import torch
        import torch._dynamo

        torch._dynamo.reset()
        counter = GraphCounter(self.compile_backend())
        return Compiled(fn=torch.compile(fn, backend=counter, dynamic=False, fullgraph=fullgraph), counter=counter)

    def compile_calls(self, calls) -> CompiledCalls:
        """``calls`` (``(fn, args, kwargs)``, their tensors on this device) in one graph, built directly and
        compiled by this target's backend as a graph from dynamo would be (conformance/call_graph.py).
        Raises where the graph cannot be built that way; dynamo (:meth:`compile`) then builds it."""
        from .call_graph import call_graph

        import torch._guards

        graph = call_graph(calls)
        counter = GraphCounter(self.compile_backend())
        with torch._guards.tracing(torch._guards.TracingContext(graph.fake_mode)):
            fn = counter(graph.module, graph.inputs)
        return CompiledCalls(graph=graph, fn=fn, counter=counter)

    # ---------------------------------------------------------------- tracking
    @property
    def can_track_ops(self) -> bool:
        return self._tracking_module is not None

    @contextmanager
    def track_ops(self) -> Iterator[OpTracker]:
        """Records which ATen ops ran on the device and which fell back to the host."""
        tracker = OpTracker()
        module = self._tracking_module
        if module is None:
            yield tracker
            return
        regions = _OPEN_REGIONS.setdefault(id(module), [])
        recorded = lambda: ({str(op) for op in module.get_executed_ops()},  # noqa: E731
                            {str(op) for op in module.get_fallback_ops()})
        if regions:  # the regions open around this one keep what the backend recorded for them so far
            executed, fallback = recorded()
            for outer in regions:
                outer.held[0].update(executed)
                outer.held[1].update(fallback)
        module.clear_op_tracking()
        regions.append(tracker)
        try:
            yield tracker
        finally:
            regions.remove(tracker)
            executed, fallback = recorded()
            tracker.trace = OpTrace(executed=tuple(sorted(executed | tracker.held[0])),
                                    fallback=tuple(sorted(fallback | tracker.held[1])))

    # ---------------------------------------------------------------- manifest
    def manifest(self) -> dict:
        """Versions, flags and environment that reproduce results on this target."""
        import torch

        info: dict[str, Any] = {
            "target": str(self.spec),
            "kind": self.kind,
            "label": self.label,
            "torch": torch.__version__,
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "machine": platform.machine(),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
            "backend_modules": [m for m in os.environ.get(BACKEND_MODULES_ENV, "").split(",") if m],
        }
        if self.compiles:
            info["compile_backend"] = self.compile_backend()
        if self.kind == "neuron-emulated":
            import emulator

            info["emulator_profile"] = emulator.profile().to_dict()
            info["emulator_faults"] = [f.spec() for f in emulator.faults()]
            info["emulator_active_faults"] = [f.spec() for f in emulator.active_faults()]
        elif self.kind == "neuron":
            info["torch_neuronx"] = _version_of("torch_neuronx")
            info["strict"] = {k: os.environ.get(k) for k in STRICT_NEURONX_ENV}
            info["neuronx_cc"] = _version_of("neuronxcc")
        elif self.kind == "cuda":
            info["cuda"] = torch.version.cuda
            info["device_name"] = torch.cuda.get_device_name(self.device)
            info["capability"] = list(torch.cuda.get_device_capability(self.device))
            info["cudnn"] = torch.backends.cudnn.version()
        elif self.kind == "privateuse1":
            module = getattr(torch, self.spec.device, None)
            info["device_module"] = getattr(module, "__name__", None)
        return info

    def describe(self) -> str:
        mode = " (torch.compile)" if self.compiles else ""
        return f"{self.label}{mode}"


def _version_of(module: str) -> str | None:
    try:
        return importlib.metadata.version(module.replace("_", "-"))
    except Exception:  # noqa: BLE001
        mod = sys.modules.get(module)
        return getattr(mod, "__version__", None)



def _privateuse1_name() -> str:
    import torch

    return torch._C._get_privateuse1_backend_name()


def resolve_target(spec: str | TargetSpec, *, backend_modules: tuple[str, ...] = ()) -> Target:
    """Turns a spec into a usable Target, or raises TargetError saying why not."""
    spec = TargetSpec.parse(spec) if isinstance(spec, str) else spec
    if backend_modules:
        import_backend_modules(backend_modules)
    import torch

    device = spec.device
    if device == "cpu":
        return Target(spec=spec, kind="cpu", label="cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise TargetError("no CUDA device: torch.cuda.is_available() is False on this machine")
        return Target(spec=spec, kind="cuda", label=f"cuda ({torch.cuda.get_device_name(0)})")
    pu1 = _privateuse1_name()
    if device == "neuron":
        import emulator

        if pu1 == "neuron" and emulator.is_registered():
            return Target(spec=spec, kind="neuron-emulated", label="neuron (emulated)", _tracking_module=torch.neuron)
        if emulator.real_backend_installed():
            apply_strict_neuronx_env()  # too late only where torch_neuronx was imported first (autoload)
            try:
                import torch_neuronx  # noqa: F401
            except Exception as exc:  # noqa: BLE001
                raise TargetError(f"no Neuron device: torch_neuronx failed to import: {type(exc).__name__}: {exc}")
            if _privateuse1_name() != "neuron" or not torch.neuron.is_available():
                raise TargetError("no Neuron device: torch_neuronx is installed but reports no available device")
            version = _version_of("torch_neuronx") or "unknown version"
            return Target(spec=spec, kind="neuron", label=f"neuron (torch_neuronx {version})", _tracking_module=torch_neuronx)
        if pu1 not in ("privateuseone", "neuron"):
            raise TargetError(f"no Neuron device: PrivateUse1 is claimed by the {pu1!r} backend")
        try:
            emulator.register()
        except emulator.EmulatorUnavailable as exc:
            raise TargetError(f"no Neuron device: torch_neuronx not installed and {exc}") from None
        return Target(spec=spec, kind="neuron-emulated", label="neuron (emulated)", _tracking_module=torch.neuron)
    if device == pu1 and device != "privateuseone":
        module = getattr(torch, device, None)
        if module is None:
            raise TargetError(f"{device}: PrivateUse1 backend registered no device module (torch.{device})")
        if hasattr(module, "is_available") and not module.is_available():
            raise TargetError(f"{device}: the backend reports no available device")
        tracking = module if all(hasattr(module, a) for a in ("get_executed_ops", "get_fallback_ops", "clear_op_tracking")) else None
        return Target(spec=spec, kind="privateuse1", label=f"{device} (PrivateUse1)", _tracking_module=tracking)
    known = list(dict.fromkeys(list(KNOWN_DEVICES) + ([pu1] if pu1 != "privateuseone" else [])))
    close = difflib.get_close_matches(device, known, n=2)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise TargetError(
        f"unknown target {device!r}{hint} (available: {', '.join(known)}; "
        "a PrivateUse1 backend needs --backend-module MOD)"
    )
