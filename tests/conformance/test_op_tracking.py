"""Tracked regions on the emulated device nest: an inner region (the migration check's eval-mode call) starts its
own record without taking the ops and host fallbacks of the region around it."""

from __future__ import annotations

import pytest


def test_a_region_inside_another_sees_its_own_ops_and_the_outer_one_keeps_all_of_them():
    torch = pytest.importorskip("torch")
    from conformance.target import resolve_target

    target = resolve_target("neuron")
    x = torch.ones(4, device="neuron")
    with target.track_ops() as outer:
        torch.tanh(x)
        with target.track_ops() as inner:
            torch.exp(x)
        torch.sin(x)
    assert "aten::exp" in inner.trace.executed and "aten::tanh" not in inner.trace.executed, inner.trace
    assert "aten::sin" not in inner.trace.executed, inner.trace
    assert {"aten::tanh", "aten::exp", "aten::sin"} <= set(outer.trace.executed), outer.trace
    with target.track_ops() as after:
        torch.cos(x)
    assert "aten::tanh" not in after.trace.executed and "aten::cos" in after.trace.executed, after.trace
