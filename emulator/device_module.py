"""``torch.neuron`` for the emulated device: what PyTorch looks up on a
backend's device module (seeding, AMP dtypes, device count) and the op
tracking API of torch_neuronx (``get_fallback_ops`` / ``get_executed_ops`` /
``clear_op_tracking``), so code written for the real backend runs unchanged.
"""

from __future__ import annotations

import torch

_ops = None


def _api():
    global _ops
    if _ops is None:
        _ops = torch.ops.neuron_emulator
    return _ops


is_emulated = True


def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def _lazy_init() -> None:
    return None


def _is_in_bad_fork() -> bool:
    return False


def device_count() -> int:
    return int(_api().device_count())


def current_device() -> int:
    return int(_api().current_device())


def set_device(device) -> None:
    index = torch.device(device).index if not isinstance(device, int) else device
    _api().set_device(int(index or 0))


class device:
    """Context manager that makes ``index`` the current neuron device."""

    def __init__(self, index) -> None:
        self.index = torch.device(index).index if not isinstance(index, int) else index
        self.previous = 0

    def __enter__(self):
        self.previous = current_device()
        set_device(self.index or 0)
        return self

    def __exit__(self, *exc) -> None:
        set_device(self.previous)


def synchronize(device=None) -> None:
    """The emulated device executes synchronously."""
    return None


def get_amp_supported_dtype() -> list[torch.dtype]:
    return [torch.bfloat16, torch.float16]


def _as_int64(seed: int) -> int:
    """A seed's 64 bits as the signed integer the schema carries (``torch.seed()`` can exceed int64)."""
    bits = int(seed) & 0xFFFF_FFFF_FFFF_FFFF
    return bits - (1 << 64) if bits >= 1 << 63 else bits


def manual_seed(seed: int) -> None:
    _api().manual_seed(current_device(), _as_int64(seed))


def manual_seed_all(seed: int) -> None:
    _api().manual_seed_all(_as_int64(seed))


def seed() -> None:
    torch.Generator(device="neuron").seed()


def initial_seed() -> int:
    return int(_api().initial_seed(current_device())) & 0xFFFF_FFFF_FFFF_FFFF  # unsigned, as torch.initial_seed()


def get_rng_state(device="neuron") -> torch.Tensor:
    index = torch.device(device).index or 0 if not isinstance(device, int) else device
    return _api().get_rng_state(index)


def set_rng_state(new_state: torch.Tensor, device="neuron") -> None:
    index = torch.device(device).index or 0 if not isinstance(device, int) else device
    _api().set_rng_state(index, new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state_all(states) -> None:
    for i, state in enumerate(states):
        set_rng_state(state, i)


def memory_allocated(device=None) -> int:
    return int(_api().memory_stats()[0])


def max_memory_allocated(device=None) -> int:
    return int(_api().memory_stats()[1])


def reset_peak_memory_stats(device=None) -> None:
    _api().reset_peak_memory()


# torch_neuronx's op tracking API.
def get_executed_ops() -> list[str]:
    return list(_api().executed_ops())


def get_fallback_ops() -> list[str]:
    return list(_api().fallback_ops())


def clear_op_tracking() -> None:
    _api().clear_tracking()


# ---------------------------------------------------------------- streams and events
# The generic torch.Stream / torch.Event of the device (its C++ guard keeps a current stream per device;
# work runs in order on the host, so an event is complete once recorded). FSDP2 and DDP reach these
# through torch.get_device_module("neuron"), as they reach torch.cuda's.
def _stream_device(device=None) -> torch.device:
    if device is None:
        return torch.device("neuron", current_device())
    device = torch.device(device) if not isinstance(device, int) else torch.device("neuron", device)
    return device if device.index is not None else torch.device("neuron", current_device())


def Stream(device=None, priority: int = 0, **kwargs) -> torch.Stream:  # noqa: N802 - torch.cuda.Stream's name
    return torch.Stream(device=_stream_device(device), priority=priority)


def Event(enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:  # noqa: N802
    return torch.Event(device="neuron", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)


def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_stream_device(device))


def default_stream(device=None) -> torch.Stream:
    return torch.Stream(device=_stream_device(device))


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


class stream:  # noqa: N801 - torch.cuda.stream's name
    """Makes ``s`` the current stream inside the block (None: no change), as torch.cuda.stream does."""

    def __init__(self, s: torch.Stream | None) -> None:
        self.stream, self.previous = s, None

    def __enter__(self):
        if self.stream is not None:
            self.previous = current_stream(self.stream.device)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            set_stream(self.previous)
