"""The emulated Neuron device: a real PrivateUse1 device named ``neuron``.

Tensors live in host memory and every ATen op runs as the CPU kernel over the
device's own bytes (see csrc/fallback.cpp), so views alias, in-place ops
mutate, ``data_ptr`` works and autograd, optimizers, ``torch.save``,
``torch.accelerator``, ``torch.autocast(device_type="neuron")`` and
``torch.compile(backend="neuron")`` behave as on a real device. A numerics
profile (profiles.py) makes it compute like a Trainium; faults (faults.py)
break it on purpose.

It registers itself through PyTorch's backend autoload entry point unless
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` or ``NEURON_VALIDATE_EMULATOR_AUTOLOAD=0``,
and never when torch_neuronx is installed or another backend has claimed
PrivateUse1.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import random
import threading
import time

from .faults import FAULT_KINDS as FAULT_KIND_CODES
from .faults import FAULTS_ENV, Fault, FaultSpecError, c10_dtype_name, format_faults, parse_faults
from .profiles import (
    DEFAULT_PROFILE,
    PROFILE_ENV,
    NumericsProfile,
    ProfileError,
    available_profiles,
    resolve_profile,
)

DEVICE_NAME = "neuron"
AUTOLOAD_ENV = "NEURON_VALIDATE_EMULATOR_AUTOLOAD"

_lock = threading.Lock()
_registered = False
_profile: NumericsProfile | None = None
_faults: list[Fault] = []
_active_faults: list[bool] = []


class EmulatorUnavailable(RuntimeError):
    """The emulated device cannot be registered in this process."""


def real_backend_installed() -> bool:
    """True when the real Neuron backend (torch_neuronx) is importable."""
    return importlib.util.find_spec("torch_neuronx") is not None


def is_registered() -> bool:
    return _registered


def unavailable_reason() -> str | None:
    """Why the emulated device cannot register here, or None if it can."""
    import torch

    if _registered:
        return None
    name = torch._C._get_privateuse1_backend_name()
    if name != "privateuseone":
        return f"PrivateUse1 is already claimed by the {name!r} backend"
    if real_backend_installed():
        return "torch_neuronx is installed, so the real Neuron backend owns the 'neuron' device"
    if importlib.util.find_spec("emulator._C") is None:
        return "the emulator's C++ part is not built (reinstall with: pip install --no-build-isolation -e .)"
    return None


def register(profile: str | NumericsProfile | None = None, faults: str | list[Fault] | None = None) -> None:
    """Registers the emulated device as ``neuron`` (idempotent).

    ``profile`` and ``faults`` default to the environment variables
    NEURON_VALIDATE_EMULATOR_PROFILE and NEURON_VALIDATE_FAULTS.
    Raises EmulatorUnavailable with the reason when it cannot register.
    """
    global _registered
    import torch

    with _lock:
        if not _registered:
            reason = unavailable_reason()
            if reason:
                raise EmulatorUnavailable(f"cannot register the emulated neuron device: {reason}")
            spec = importlib.util.find_spec("emulator._C")
            torch.ops.load_library(spec.origin)
            torch.ops.neuron_emulator.mirror_cpu_kernels()
            torch.utils.rename_privateuse1_backend(DEVICE_NAME)
            from . import device_module

            torch._register_device_module(DEVICE_NAME, device_module)
            torch.utils.generate_methods_for_privateuse1_backend(
                for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
            )
            _registered = True
            atexit.register(_let_autograd_threads_settle)
            _register_record_stream()
            if torch.distributed.is_available():
                from . import process_group

                process_group.register(active_faults=active_faults, profile=current_profile)
            set_profile(profile if profile is not None else os.environ.get(PROFILE_ENV))
            set_faults(faults if faults is not None else os.environ.get(FAULTS_ENV, ""))
            os.register_at_fork(after_in_child=_draw_faults_again)
            return
    if profile is not None:
        set_profile(profile)
    if faults is not None:
        set_faults(faults)


_stream_library = None


def _register_record_stream() -> None:
    """``Tensor.record_stream`` on the device: a no-op, as on any device whose streams run in order on the
    host (FSDP2 and DDP call it to keep a buffer alive until a stream is done with it)."""
    global _stream_library
    import torch

    _stream_library = torch.library.Library("aten", "IMPL")
    _stream_library.impl("record_stream", lambda self, stream: None, "PrivateUse1")


def _let_autograd_threads_settle() -> None:
    """Gives autograd's device thread a moment, at exit, to drop its last graph task.

    A backward pass on any non-CPU device runs on an autograd worker thread
    that releases the graph task (and the Python context torch stashes in it)
    just after the caller's backward() returns. When backward() is the
    script's last statement, that release can land in interpreter
    finalisation, where taking the GIL ends the thread through a forced
    unwind and the process aborts ("terminate called without an active
    exception"). Waiting here, with the interpreter still alive and the GIL
    released, lets the release finish first.
    """
    time.sleep(0.05)


def _require_registered() -> None:
    if not _registered:
        raise EmulatorUnavailable("the emulated neuron device is not registered (call emulator.register())")


def set_profile(spec: str | NumericsProfile | None) -> NumericsProfile:
    """Activates a numerics profile; returns it."""
    global _profile
    import torch

    _require_registered()
    p = resolve_profile(spec)
    auto_cast = {"none": 0, "matmult": 1, "all": 2}[p.auto_cast]
    cast_type = {"bf16": 0, "fp16": 1, "tf32": 2, "fp8_e4m3": 3}[p.auto_cast_type]
    torch.ops.neuron_emulator.set_profile(
        p.name,
        auto_cast,
        cast_type,
        p.integer_matmul_fp32,
        p.stochastic_rounding,
        p.stochastic_rounding_seed,
        p.approximate_activations,
        p.activation_knots_per_unit,
        [r[0] for r in p.activation_ranges],
        [float(r[1]) for r in p.activation_ranges],
        [float(r[2]) for r in p.activation_ranges],
        list(p.fallback_ops),
        list(p.unsupported_ops),
        p.independent_rng,
        p.rerun_failed_kernels_on_host,
    )
    _profile = p
    return p


def profile() -> NumericsProfile:
    """The active numerics profile."""
    _require_registered()
    assert _profile is not None
    return _profile


current_profile = profile  # the accessor the process group reads: register's own argument shadows ``profile``


def set_faults(faults: str | list[Fault] | None) -> list[Fault]:
    """Installs faults (replacing any); returns the ones active in this process."""
    global _faults, _active_faults
    import torch

    _require_registered()
    parsed = parse_faults(faults) if isinstance(faults, str) or faults is None else list(faults)
    # Collectives' faults live in the process group, the compiler's in the compile backend.
    kernel = [f for f in parsed if not f.collective and f.mode != "compiler"]
    if kernel:
        torch.ops.neuron_emulator.mirror_ops_matching([f.op for f in kernel])
    active = iter(torch.ops.neuron_emulator.set_faults(
        [FAULT_KIND_CODES[f.kind] for f in kernel],
        [f.op for f in kernel],
        [float(f.rel) for f in kernel],
        [f.phase for f in kernel],
        [c10_dtype_name(f.dtype) for f in kernel],
        [float(f.probability) for f in kernel],
        [f.mode for f in kernel],
    ))
    _faults = parsed
    _active_faults = [random.random() < f.probability if f.collective or f.mode == "compiler" else next(active)
                      for f in parsed]
    _break_host_kernels([f for f, on in zip(parsed, _active_faults) if on and f.host])
    return [f for f, on in zip(parsed, _active_faults) if on]


def apply_environment() -> None:
    """Sets the profile and faults from NEURON_VALIDATE_EMULATOR_PROFILE and NEURON_VALIDATE_FAULTS as they are now.

    The device takes them when it registers, which is when torch is first imported. A process that sets them
    later (a harness worker applies its run's environment when it starts) may have registered it before:
    multiprocessing's ``spawn`` runs the parent's main module again in the child, and a main module that imports
    torch registers the device there with the parent's environment. No-op while the device is not registered.
    """
    if _registered:
        set_profile(os.environ.get(PROFILE_ENV))
        set_faults(os.environ.get(FAULTS_ENV, ""))


def _draw_faults_again() -> None:
    """A forked child is a process of its own, so a fault active with probability p is drawn there again.

    Workers forked from one preloaded parent (runner.zygote) would otherwise all share the parent's draw: a
    flaky fault on in every one or in none, and a gate's reruns in "fresh" processes all meeting it.
    Python's own generator is reseeded in the child before this runs (the random module registers first).
    """
    if any(0.0 < f.probability < 1.0 for f in _faults):
        set_faults(_faults)


_host_library = None


def _break_host_kernels(faults: list[Fault]) -> None:
    """Replaces the CPU's own kernel of each ``host=1`` fault's op with the fault (see faults.py)."""
    global _host_library
    import torch

    if _host_library is not None:
        _host_library._destroy()
        _host_library = None
    if not faults:
        return
    import warnings

    from .faults import host_kernel

    _host_library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "overriding a previously registered kernel": that is the point
        for fault in faults:
            _host_library.impl(fault.op.removeprefix("aten::"), host_kernel(fault.kind), "CPU")


def faults() -> list[Fault]:
    """Faults installed in this process, active or not."""
    return list(_faults)


def active_faults() -> list[Fault]:
    return [f for f, on in zip(_faults, _active_faults) if on]


def copy_stats() -> dict[str, int]:
    """Host/device copy counters since the last reset."""
    import torch

    _require_registered()
    h2d, d2h, d2d, bh2d, bd2h = torch.ops.neuron_emulator.copy_stats()
    return {
        "host_to_device": h2d,
        "device_to_host": d2h,
        "device_to_device": d2d,
        "bytes_host_to_device": bh2d,
        "bytes_device_to_host": bd2h,
    }


def reset_copy_stats() -> None:
    import torch

    _require_registered()
    torch.ops.neuron_emulator.reset_copy_stats()



__all__ = [
    "AUTOLOAD_ENV",
    "DEFAULT_PROFILE",
    "DEVICE_NAME",
    "EmulatorUnavailable",
    "Fault",
    "FaultSpecError",
    "NumericsProfile",
    "ProfileError",
    "active_faults",
    "apply_environment",
    "available_profiles",
    "copy_stats",
    "faults",
    "format_faults",
    "is_registered",
    "parse_faults",
    "profile",
    "real_backend_installed",
    "register",
    "reset_copy_stats",
    "resolve_profile",
    "set_faults",
    "set_profile",
    "unavailable_reason",
]
