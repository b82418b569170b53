"""conformance.seeding: workers skip seeding backends they cannot use, and seeding still seeds what runs.

In a fresh interpreter (the shortcut changes torch's module attributes, as
in a worker): after it, torch.manual_seed still makes the CPU and the
emulated device repeat their random streams, and only unavailable backends
lose their queued seeding (the stack trace PyTorch formats for each call).
"""

from __future__ import annotations

import json

from tests.conftest import run_python

CODE = r"""
import json
import torch
import emulator
from conformance.seeding import LAZILY_SEEDED_BACKENDS, skip_seeding_unavailable_backends

emulator.register()
unavailable = [n for n in LAZILY_SEEDED_BACKENDS if hasattr(getattr(torch, n, None), "manual_seed_all")
               and not getattr(torch, n).is_available()]

def queued_cuda_seed():
    return torch.cuda._lazy_seed_tracker.manual_seed_all_cb  # (callback, formatted stack) or None

torch.manual_seed(1)
queued_before = queued_cuda_seed()
skipped = skip_seeding_unavailable_backends()
torch.manual_seed(2)
queued_again = queued_cuda_seed() is not queued_before  # a new callback and stack trace were queued

def draws():
    torch.manual_seed(1234)
    return torch.rand(5).tolist(), torch.rand(5, device="neuron").cpu().tolist()

first, second = draws(), draws()
torch.manual_seed(99)
other = torch.rand(5).tolist()
print(json.dumps({"unavailable": unavailable, "skipped": skipped, "same": first == second,
                  "differs": other != first[0], "cuda_queued": queued_before is not None,
                  "cuda_queued_after_skip": queued_again}))
"""


def test_unavailable_backends_are_skipped_and_seeding_still_seeds():
    result = run_python(CODE)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got["skipped"] == got["unavailable"]
    assert got["same"], "manual_seed must still fix the CPU and neuron random streams"
    assert got["differs"], "a different seed must still give different numbers"
    if "cuda" in got["skipped"]:
        assert got["cuda_queued"], "without the shortcut PyTorch queues the seed with a stack trace"
        assert not got["cuda_queued_after_skip"], "with it, nothing is queued (no stack trace is formatted)"
