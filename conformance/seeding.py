"""Seeding: ``torch.manual_seed`` without the cost of seeding backends a worker cannot use, and the host's
global generators (Python's and NumPy's).

``torch.manual_seed`` also seeds CUDA, XPU and MTIA. While one of them is not
initialised, its seed is queued together with ``traceback.format_stack()``,
to be applied when it initialises (``_lazy_call`` in ``torch/cuda/__init__.py``
and its copies). Under a harness's deep call stacks that costs about 0.5 ms
per ``manual_seed`` call, and OpInfo's sample iterator seeds before every
sample: measured on a stratified 300-case slice of the operator sweep, a
fifth of all case time went to formatting stack traces.

A backend that is not available in this process can never initialise here,
so its queued seed is never applied and skipping the queueing changes no
result. Available backends (a CUDA target, say) keep PyTorch's behaviour.
Only harness worker processes call this; user code is never touched.
"""

from __future__ import annotations

import sys

LAZILY_SEEDED_BACKENDS = ("cuda", "xpu", "mtia")


def _not_applied(seed: int) -> None:
    """Stands in for ``manual_seed_all`` of a backend that cannot initialise in this process."""
    int(seed)  # the same argument check PyTorch's version makes first


def skip_seeding_unavailable_backends() -> list[str]:
    """Makes ``manual_seed_all`` a no-op for each lazily seeded backend that is unavailable; returns their names."""
    import torch

    skipped = []
    for name in LAZILY_SEEDED_BACKENDS:
        module = getattr(torch, name, None)
        if module is None or not hasattr(module, "manual_seed_all"):
            continue
        try:
            usable = module.is_available() or module.is_initialized()
        except Exception:  # noqa: BLE001 - a backend that cannot even answer is left as PyTorch has it
            continue
        if not usable:
            module.manual_seed_all = _not_applied
            skipped.append(name)
    return skipped


def seed_host_generators(seed: int | None) -> None:
    """Python's and NumPy's global generators from ``seed``, or from the OS (None) as a new interpreter seeds
    them: a forked worker must not share the stream of the process it was forked from."""
    import random

    random.seed(seed)
    try:
        import numpy
    except ImportError:
        return
    numpy.random.seed(None if seed is None else seed % 2**32)


def host_generator_state() -> tuple:
    """Python's global generator's state, and NumPy's where the process has imported NumPy (None otherwise): what
    :func:`set_host_generator_state` puts back."""
    import random

    numpy = sys.modules.get("numpy")
    return random.getstate(), (numpy.random.get_state() if numpy is not None else None)


def set_host_generator_state(state: tuple) -> None:
    """Python's and NumPy's global generators at ``state`` (from :func:`host_generator_state`)."""
    import random

    python, numpy_state = state
    random.setstate(python)
    numpy = sys.modules.get("numpy")
    if numpy is not None and numpy_state is not None:
        numpy.random.set_state(numpy_state)
