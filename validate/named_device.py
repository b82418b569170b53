"""A script that names the target's device itself, run on the CPU reference.

A script moved to Trainium by naming the device (``device = torch.device("neuron")``, ``.to("neuron")``,
``torch.autocast("neuron")``, ``torch.neuron.synchronize()``, ``-- --device neuron``) is the migration this
check exists for, and the CPU reference could not run it ("Expected one of cpu, cuda, ... device string:
neuron"). On a CPU side the name means the CPU:

* it parses: PrivateUse1 takes the name, with no kernels behind it, and a stand-in device module answers
  ``torch.neuron.*`` as a CPU would (one device, nothing to synchronize, no device memory; its generator is
  the CPU's, whose draws are the ones this side makes for the device);
* a function mode over every torch call makes device arguments naming it, and the tensor method of its name
  (``x.neuron()``, ``x.cuda()`` for a ``cuda`` target), name the CPU (diff.sides.device_named_as);
* autocast for it is the CPU's, as a script that picks its device through ``torch.accelerator`` gets here.

What has no CPU meaning (a generator made on the device, a stream) still fails, with a hint. The function
mode costs time on every torch call: this side's steps per second are not the CPU's own.
"""

from __future__ import annotations

import contextlib
import types


def _stand_in_module(torch, name: str) -> types.ModuleType:
    """``torch.<name>`` on the CPU: what a script asks of its device module, answered for the CPU."""
    module = types.ModuleType(f"torch.{name}", f"the CPU standing in for {name} (neuron-validate's reference)")
    nothing = lambda *args, **kwargs: None  # noqa: E731
    zero = lambda *args, **kwargs: 0  # noqa: E731
    module.is_available = lambda: True
    module.is_initialized = lambda: True
    module._is_in_bad_fork = lambda: False
    module.device_count = lambda: 1
    module.current_device = zero
    module.set_device = module.synchronize = module.empty_cache = module.reset_peak_memory_stats = nothing
    module.memory_allocated = module.max_memory_allocated = module.memory_reserved = zero
    # Seeding is the device's generator on the target, whose draws this side makes from the CPU's generator in
    # the same order: seeding that here would move the CPU's own draws (a shuffle) away from the target's.
    module.manual_seed = module.manual_seed_all = module.seed = nothing
    module.initial_seed = torch.initial_seed
    module.get_rng_state = lambda device=None: torch.get_rng_state()
    module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
    module.get_amp_supported_dtype = lambda: [torch.float16, torch.bfloat16, torch.float32]

    class _Device:
        def __init__(self, device) -> None:
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc) -> None:
            return None

    module.device = _Device

    def missing(attr: str):
        raise AttributeError(f"torch.{name}.{attr} has no meaning on the CPU reference, which takes {name} for "
                             f"the CPU")

    module.__getattr__ = missing
    return module


@contextlib.contextmanager
def named_device_on_cpu(torch, name: str | None):
    """While the script runs on a CPU side, ``name`` (the target's device type) means the CPU."""
    if not name:
        yield
        return
    from diff.sides import device_named_as

    try:
        torch.device(name)
    except RuntimeError:
        torch.utils.rename_privateuse1_backend(name)
        if not hasattr(torch, name):
            torch._register_device_module(name, _stand_in_module(torch, name))
            torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True,
                                                                 for_packed_sequence=True, for_storage=False)
    autocast = torch.amp.autocast_mode.autocast
    original_init = autocast.__init__

    def init(self, device_type, *args, **kwargs):
        return original_init(self, "cpu" if device_type == name else device_type, *args, **kwargs)

    autocast.__init__ = init
    try:
        with device_named_as(torch.device("cpu"), name):
            yield
    finally:
        autocast.__init__ = original_init


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
