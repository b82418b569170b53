"""Entry point of the ``torch.backends`` group: runs inside ``import torch``.

It must never raise (a raise here breaks ``import torch`` for every program in
the environment), so a failure becomes a warning. It stands aside when
NEURON_VALIDATE_EMULATOR_AUTOLOAD=0 (the harness sets it before importing torch
when ``--backend-module`` names another backend), when torch_neuronx is
installed, and when another backend has already claimed PrivateUse1.
"""

from __future__ import annotations

import os
import warnings


def autoload() -> None:
    if os.environ.get("NEURON_VALIDATE_EMULATOR_AUTOLOAD", "1") == "0":
        return
    try:
        from . import register, unavailable_reason

        if unavailable_reason() is None:
            register()
    except Exception as exc:  # noqa: BLE001 - see the module docstring
        warnings.warn(f"neuron-validate: the emulated neuron device was not registered: {exc}", stacklevel=2)
