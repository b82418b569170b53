"""The watch on a side's random stream: whether a sample drew random numbers on the target's own generator
(then it is judged by distribution, not value for value); and the CPU's stream moved elsewhere, for the
reference's runs on other streams that such a sample is judged against."""

from __future__ import annotations

from contextlib import contextmanager

import torch


@contextmanager
def other_stream(k: int):
    """The CPU's global random stream on another seed while the block runs, every reseed inside it moved too (OpInfo's
    ``wrapper_set_seed`` seeds 42 before each random op): stream ``k`` of the reference. ``k`` 0 is its own."""
    seed = torch.manual_seed
    state = torch.get_rng_state()

    def moved(value):
        return seed((int(value) + k * 1_000_003) % 2**63)

    torch.manual_seed = moved
    try:
        seed(k * 7919 + 1)
        yield
    finally:
        torch.manual_seed = seed
        torch.set_rng_state(state)


class DrawWatch:
    """Whether a run drew random numbers from ``module``'s generator (a device module, or None: never).

    The generator is seeded before the run and its state compared after. OpInfo's random ops reseed the
    same seed (``wrapper_set_seed``) and restore the state afterwards (``freeze_rng_state``), so the state
    is also compared whenever something restores it. Truthy after a run that drew."""

    SEED = 42  # wrapper_set_seed's

    def __init__(self, module) -> None:
        self.module, self.state, self.drew, self._restore = module, None, False, None

    def __enter__(self) -> "DrawWatch":
        if self.module is not None:
            self.module.manual_seed(self.SEED)
            self.state = self.module.get_rng_state().clone()
            self._restore = self.module.set_rng_state

            def set_rng_state(new_state, *args, **kwargs):
                self._check()
                return self._restore(new_state, *args, **kwargs)

            self.module.set_rng_state = set_rng_state
        return self

    def _check(self) -> None:
        if not self.drew and not torch.equal(self.state, self.module.get_rng_state()):
            self.drew = True

    def __exit__(self, *exc) -> None:
        if self.module is not None:
            self.module.set_rng_state = self._restore
            self._check()

    def __bool__(self) -> bool:
        return self.drew
