"""A script that names its device itself, run on each side's own device.

A script moved to Trainium by naming the device (``device = torch.device("neuron")``, ``.to("neuron")``,
``torch.autocast("neuron")``, ``torch.neuron.synchronize()``, ``-- --device neuron``) is the migration this
check exists for, and the CPU reference could not run it ("Expected one of cpu, cuda, ... device string:
neuron"). A script written for CUDA (``.cuda()``, ``torch.device("cuda")``, or ``"cuda" if
torch.cuda.is_available() else "cpu"``, which on any other machine trains on the CPU) is the migration before
that one change: checked as it stands, it either failed on the reference (exit 2) or never used the target.

So while the script runs, the device type it names (``name``) means the side's own device:

* the name parses: on the CPU, PrivateUse1 takes it where no backend did, with no kernels behind it;
* its device module answers as the side's device would: a stand-in ``torch.neuron`` on the CPU (one device,
  nothing to synchronize, no device memory, streams that run in order and events timed by the host's
  clock), ``torch.cuda`` answered by the target's own device module on the
  target (``torch.cuda.is_available()`` is True on every side, so every side takes the script's CUDA branch);
  what scripts print about memory (``mem_get_info``, ``memory_summary``, ``memory_stats``) and the NVTX
  ranges they mark are answered on a side whose device module lacks them;
* a function mode over every torch call makes device arguments naming it, and the tensor method of its name
  (``x.neuron()``, ``x.cuda()``), name the side's device (diff.sides.device_named_as);
* autocast and ``GradScaler`` for it are the side's device's.

Seeding the named device on the CPU does nothing: there the device's draws come from the CPU's generator in
the order the target makes them, and seeding that would move the CPU's own draws (a shuffle) away from the
target's. What has no meaning on the side's device (a generator made on it, a CUDA-only API such as
``get_device_properties``) still fails,
with a hint. The function mode costs time on every torch call: a side's steps per second are not its own.
"""

from __future__ import annotations

import contextlib
import types

_MISSING = object()


def _returning(value):
    """A function of its own that returns ``value``: torch.compile's rules refuse one object under two names."""
    return lambda *args, **kwargs: value


def _calling(fn, named: str | None = None, device=None):
    """A function of its own that calls ``fn`` (see :func:`_returning`), a device argument of type ``named``
    (``torch.cuda.set_device(torch.device("cuda", 0))``) given as ``device`` with its index."""
    import torch

    from diff.sides import names_device_type

    def swap(value):
        if named is None or not names_device_type(value, named):
            return value
        return torch.device(device.type, torch.device(value).index or 0)

    return lambda *args, **kwargs: fn(*map(swap, args), **{key: swap(value) for key, value in kwargs.items()})


# torch.cuda's older names for resetting its peak statistics, which PyTorch's own tutorials still call
# (mixed_precision_tutorial's ``torch.cuda.reset_max_memory_allocated()``): they call CUDA's
# reset_peak_memory_stats from inside torch.cuda, past the side's answer to that name.
_OLD_RESETS = ("reset_max_memory_allocated", "reset_max_memory_cached", "reset_accumulated_memory_stats")

# No CUDA compute capability: a script that picks a path by it (bfloat16 or TF32 from 8.0, flash attention)
# takes its most general one on every side.
_NO_CAPABILITY = (0, 0)


def _cpu_answers(torch) -> dict:
    """What a device module answers on the CPU."""
    answers = {name: _returning(None) for name in ("set_device", "synchronize", "empty_cache",
                                                   "reset_peak_memory_stats", *_OLD_RESETS, "manual_seed",
                                                   "manual_seed_all", "seed")}
    answers.update({name: _returning(0) for name in ("current_device", "memory_allocated", "max_memory_allocated",
                                                     "memory_reserved", "max_memory_reserved", "memory_cached",
                                                     "max_memory_cached")})
    answers.update(_memory_report("cpu", lambda: 0, lambda: 0))
    answers.update({name: _returning(True) for name in ("is_available", "is_initialized", "is_bf16_supported")})
    answers.update(device_count=_returning(1), get_device_name=_returning("cpu"), device=_NoDevice,
                   get_device_capability=_returning(_NO_CAPABILITY),
                   initial_seed=_calling(torch.initial_seed),
                   get_rng_state=lambda device=None: torch.get_rng_state(),
                   set_rng_state=lambda state, device=None: torch.set_rng_state(state),
                   get_amp_supported_dtype=_returning([torch.float16, torch.bfloat16, torch.float32]),
                   Stream=_HostStream, Event=_HostEvent, current_stream=_calling(_HostStream),
                   default_stream=_calling(_HostStream), stream=lambda stream=None: contextlib.nullcontext())
    return answers


def _host_memory() -> tuple[int, int]:
    """(available, total) bytes of the host's memory, which is the memory of the CPU and the emulated device."""
    import os

    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _memory_report(label: str, allocated, peak) -> dict:
    """What scripts print about device memory (``mem_get_info``, ``memory_stats``, ``memory_summary``) and the
    profiler ranges they mark (``torch.cuda.nvtx``), for a side whose device module has none of them: from its
    bytes ``allocated`` and ``peak`` now, and the host's memory (``label``: the device the summary names). None
    changes what a side computes; without them such a script failed on a side for want of CUDA ("Found no
    NVIDIA driver") and was never checked."""
    def summary(device=None, abbreviated: bool = False) -> str:
        return (f"memory of {label}: {allocated() / 2**20:.1f} MiB allocated, "
                f"{peak() / 2**20:.1f} MiB at the peak")

    nvtx = types.SimpleNamespace(range_push=lambda msg: 0, range_pop=lambda: 0, mark=lambda msg: None,
                                 range_start=lambda msg: 0, range_end=lambda range_id: None,
                                 range=lambda msg, *args, **kwargs: contextlib.nullcontext())
    return {"mem_get_info": lambda device=None: _host_memory(), "memory_summary": summary, "nvtx": nvtx,
            "memory_stats": lambda device=None: {"allocated_bytes.all.current": allocated(),
                                                 "allocated_bytes.all.peak": peak()}}


class _HostStream:
    """A device stream on the CPU: work runs in order, so there is nothing to wait for."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        return None

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or _HostEvent()
        event.record()
        return event

    def query(self) -> bool:
        return True


class _HostEvent:
    """A device event on the CPU: complete once recorded, timed by the host's clock (``elapsed_time`` in ms), with
    CUDA's errors (and the emulated device's) for an event never recorded or made without timing."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._at: float | None = None
        self._timing = enable_timing

    def record(self, stream=None) -> None:
        import time

        self._at = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def wait(self, stream=None) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "_HostEvent") -> float:
        if self._at is None or end._at is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        if not (self._timing and end._timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        return (end._at - self._at) * 1000.0


def _device_answers(torch, device) -> dict:
    """``torch.cuda`` answered by the side's own device module (the target's)."""
    module = torch.get_device_module(device.type)
    answers = {name: _returning(True) for name in ("is_available", "is_initialized", "is_bf16_supported")}
    answers.update(device=_NoDevice, get_device_name=_returning(f"{device.type} (standing in for cuda)"),
                   get_device_capability=_returning(_NO_CAPABILITY))
    allocated = getattr(module, "memory_allocated", _returning(0))
    peak = getattr(module, "max_memory_allocated", allocated)
    answers.update(_memory_report(str(device), allocated, peak), memory_reserved=allocated, max_memory_reserved=peak,
                   memory_cached=allocated, max_memory_cached=peak)
    reset = getattr(module, "reset_peak_memory_stats", None)
    answers.update({name: _calling(reset, "cuda", device) if reset else _returning(None) for name in _OLD_RESETS})
    for name in ("device_count", "current_device", "set_device", "synchronize", "empty_cache",
                 "reset_peak_memory_stats", "memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "mem_get_info", "memory_stats", "memory_summary", "manual_seed",
                 "manual_seed_all", "seed", "initial_seed", "get_rng_state", "set_rng_state", "current_stream",
                 "default_stream"):
        if hasattr(module, name):
            answers[name] = _calling(getattr(module, name), "cuda", device)
    for name in ("Stream", "Event"):  # classes: PyTorch asks isinstance(obj, torch.cuda.Event) of what it pickles
        if hasattr(module, name):
            answers[name] = _made_by(_calling(getattr(module, name), "cuda", device), name)
    if hasattr(module, "stream"):
        answers["stream"] = _calling(module.stream, "cuda", device)
    return answers


def _made_by(make, name: str) -> type:
    """A class of its own whose construction returns ``make(...)``: ``torch.cuda.Event`` answered by the side's
    device module must stay a type, for PyTorch's own ``isinstance`` checks (DDP's gradient futures pickle
    their values past one: "isinstance() arg 2 must be a type" failed every CUDA script's DDP backward)."""
    return type(name, (), {"__new__": lambda cls, *args, **kwargs: make(*args, **kwargs)})


class _NoDevice:
    """``torch.<name>.device(index)``: the side has one device, already current."""

    def __init__(self, device) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _stand_in_module(name: str, answers: dict) -> types.ModuleType:
    module = types.ModuleType(f"torch.{name}", f"the CPU standing in for {name} (neuron-validate's reference)")
    for key, value in answers.items():
        setattr(module, key, value)

    def missing(attr: str):
        raise AttributeError(f"torch.{name}.{attr} has no meaning on the CPU reference, which takes {name} for "
                             f"the CPU")

    module.__getattr__ = missing
    return module


def _outside_torch(module, answers: dict) -> dict:
    """The answers for callers outside PyTorch (the script, its libraries); PyTorch's own code keeps the real
    module's. Told that CUDA is there, dynamo asked CUDA for its properties while compiling the script's
    model, on a machine without it: "CUDA driver version is insufficient"."""
    import sys

    def split(answer, real):
        def call(*args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            inside = caller == "torch" or caller.startswith("torch.")
            return (real if inside else answer)(*args, **kwargs)

        return call

    return {key: split(answer, getattr(module, key)) if (isinstance(answer, types.FunctionType)
                                                         and isinstance(getattr(module, key, None), types.FunctionType))
            else answer for key, answer in answers.items()}


@contextlib.contextmanager
def _patched(obj, answers: dict):
    saved = {key: getattr(obj, key, _MISSING) for key in answers}
    for key, value in answers.items():
        setattr(obj, key, value)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is _MISSING:
                delattr(obj, key)
            else:
                setattr(obj, key, value)


@contextlib.contextmanager
def _amp_for(torch, name: str, device_type: str):
    """``torch.autocast(name)`` and ``GradScaler(name)`` (``torch.cuda.amp``'s too) for ``device_type``."""
    take = lambda given: device_type if given == name else given  # noqa: E731
    autocast, scaler = torch.amp.autocast_mode.autocast, torch.amp.GradScaler
    autocast_init, scaler_init = autocast.__init__, scaler.__init__

    def init_autocast(self, device_type, *args, **kwargs):
        return autocast_init(self, take(device_type), *args, **kwargs)

    def init_scaler(self, device="cuda", *args, **kwargs):
        return scaler_init(self, take(device), *args, **kwargs)

    with _patched(autocast, {"__init__": init_autocast}), _patched(scaler, {"__init__": init_scaler}):
        yield


def _collectives_for(name: str, device) -> dict:
    """``torch.distributed``'s group makers with ``nccl`` (CUDA's collectives, what a script written for CUDA
    asks for) taken for the side's own backend: gloo on the CPU, the target's for its device type with gloo
    for CPU tensors (distributed/backends.py). A script's other backends are left as it names them. Without
    this, PyTorch's own DDP tutorial failed on the reference: "ProcessGroupNCCL is only supported with GPUs".
    A script for another device type names no nccl: nothing changes."""
    import torch.distributed as dist

    from distributed.backends import backend_for

    if name != "cuda" or not dist.is_available():
        return {}
    own = "gloo" if device.type == "cpu" else f"cpu:gloo,{device.type}:{backend_for(device.type)}"

    def taken(backend):
        return own if isinstance(backend, str) and "nccl" in backend.lower() else backend

    def with_backend(fn, position: int):  # the backend's position among fn's arguments
        def call(*args, **kwargs):
            if "backend" in kwargs:
                kwargs["backend"] = taken(kwargs["backend"])
            elif len(args) > position:
                args = (*args[:position], taken(args[position]), *args[position + 1:])
            return fn(*args, **kwargs)

        return call

    return {"init_process_group": with_backend(dist.init_process_group, 0),
            "new_group": with_backend(dist.new_group, 2)}  # new_group(ranks, timeout, backend)


@contextlib.contextmanager
def _ddp_on_the_sides_device(torch, name: str):
    """``DistributedDataParallel(model, device_ids=[local_rank])``, as CUDA scripts wrap their model: the ids
    name CUDA devices, and a rank's is the side's device for that rank. They become the module's own device:
    none on the CPU (DDP takes a CPU module only without ids; without this the reference refused the module),
    its index elsewhere."""
    if name != "cuda" or not torch.distributed.is_available():
        yield
        return
    from torch.nn.parallel import DistributedDataParallel

    init = DistributedDataParallel.__init__

    def init_on_modules_device(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if device_ids is not None or output_device is not None:
            where = next((p.device for p in module.parameters()), torch.device("cpu"))
            device_ids = None if where.type == "cpu" else [where.index or 0]
            output_device = None
        return init(self, module, device_ids, output_device, *args, **kwargs)

    with _patched(DistributedDataParallel, {"__init__": init_on_modules_device}):
        yield


@contextlib.contextmanager
def script_device(torch, name: str | None, device):
    """While the script runs on a side whose device is ``device``, the device type ``name`` means it."""
    from diff.sides import device_named_as

    device = torch.device(device)
    if not name or name == device.type:
        yield
        return
    answers = _cpu_answers(torch) if device.type == "cpu" else _device_answers(torch, device)
    try:
        torch.device(name)
    except RuntimeError:
        torch.utils.rename_privateuse1_backend(name)  # no backend took PrivateUse1 here: the CPU side
    module = getattr(torch, name, None)
    if module is None:
        torch._register_device_module(name, _stand_in_module(name, answers))
        torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                             for_packed_sequence=True, for_storage=False)
        patched = contextlib.nullcontext()
    else:
        patched = _patched(module, _outside_torch(module, answers))
    collectives = _collectives_for(name, device)
    with patched, _amp_for(torch, name, device.type), device_named_as(device, name), \
            (_patched(torch.distributed, collectives) if collectives else contextlib.nullcontext()), \
            _ddp_on_the_sides_device(torch, name):
        yield


@contextlib.contextmanager
def torch_neuronx_stand_in(torch, target_device: str, on_target: bool):
    """``import torch_neuronx`` where the emulated device stands in for it (the target is ``neuron`` and
    torch_neuronx is not installed).

    The native backend autoloads, so importing it is optional, and scripts written for Trainium often do it
    anyway: the check stopped at "the script fails to import: No module named 'torch_neuronx'" on both sides,
    which is the harness's arrangement, not the script's fault. The stand-in offers what the native package
    offers a training script beside registering the device, its op tracking (``get_executed_ops``,
    ``get_fallback_ops``, ``clear_op_tracking``): the emulated device's on the target, nothing on a CPU side,
    where nothing runs on a device. Anything else it names raises, saying so."""
    import importlib.util
    import sys

    if target_device != "neuron" or "torch_neuronx" in sys.modules or importlib.util.find_spec("torch_neuronx"):
        yield
        return
    module = types.ModuleType("torch_neuronx", "the emulated neuron device standing in for torch_neuronx")
    module.__version__ = "emulated"
    device = getattr(torch, "neuron", None) if on_target else None
    for name in ("get_executed_ops", "get_fallback_ops", "clear_op_tracking"):
        setattr(module, name, getattr(device, name) if device is not None else (lambda: []))

    def missing(attr: str):
        raise AttributeError(f"torch_neuronx.{attr}: the emulated neuron device stands in for torch_neuronx's "
                             "device and op tracking only (torch_neuronx is not installed here)")

    module.__getattr__ = missing
    sys.modules["torch_neuronx"] = module
    try:
        yield
    finally:
        sys.modules.pop("torch_neuronx", None)
