"""Which process-group backend a target's ranks use, and setting it up in a rank.

Whatever backend registered itself for the target's device type with
c10d (``Backend.register_backend(..., devices=[...])``) serves it: the
emulated device's ``neuron`` (emulator/process_group.py), torch_neuronx's own
when it is installed, ``nccl`` on CUDA. The group is created in the
device-mapped form ``cpu:gloo,<device>:<backend>``, so CPU tensors (object
collectives, barriers) keep gloo.
"""

from __future__ import annotations


class NoBackend(RuntimeError):
    """No process-group backend is registered for the target's device type."""


def backend_for(device_type: str) -> str:
    import torch.distributed as dist

    if device_type == "cpu":
        return "gloo"
    name = dist.Backend.default_device_backend_map.get(device_type)
    if not name:
        raise NoBackend(f"no process-group backend is registered for the {device_type!r} device (c10d knows: "
                        f"{', '.join(f'{k}:{v}' for k, v in sorted(dist.Backend.default_device_backend_map.items()))})")
    return name


def devices_short(target, world: int) -> str:
    """Why ``world`` ranks cannot each have a device of a real target ("" when they can): NCCL and real
    backends take one device per rank (the emulated device and the CPU serve any number of processes)."""
    if target.kind in ("cpu", "neuron-emulated"):
        return ""
    module = getattr(__import__("torch"), target.device.type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 0
    if count and count < world:
        return f"{world} ranks need {world} {target.device.type} devices, one per rank; this machine has {count}"
    return ""


def init_target_group(target) -> None:
    """``init_process_group`` from the launcher's environment, on the target's device (its index: the local rank)."""
    import os

    import torch.distributed as dist

    device_type = target.device.type
    backend = backend_for(device_type)
    spec = backend if device_type == "cpu" else f"cpu:gloo,{device_type}:{backend}"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    module = getattr(__import__("torch"), device_type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 1
    if device_type != "cpu" and count > 1 and hasattr(module, "set_device"):
        module.set_device(local % count)
    dist.init_process_group(backend=spec)
