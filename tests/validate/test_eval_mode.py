"""The eval-mode call of validate.functions.eval_mode_check, in process on the emulated device: which side a
failure in eval mode is charged to, and that the model's modes are put back."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class _EvalFailsOn(torch.nn.Module):
    """Raises in eval mode on one device type: a failure that belongs to that side."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.lin = torch.nn.Linear(4, 3)
        self.norm = torch.nn.BatchNorm1d(3)

    def forward(self, x):
        if not self.training and x.device.type == self.device_type:
            raise RuntimeError(f"no eval on {self.device_type}")
        return self.norm(self.lin(x))


@pytest.fixture(scope="module")
def sides():
    from conformance.target import resolve_target

    return resolve_target("neuron"), resolve_target("cpu")


def test_a_model_that_fails_in_eval_mode_on_the_reference_is_not_compared_and_on_the_target_is_the_targets(sides):
    from validate.functions import eval_mode_check

    target, reference = sides
    x = torch.randn(5, 4)
    model = _EvalFailsOn("cpu")
    seen = eval_mode_check(model, (x,), {}, target=target, reference=reference)["eval_mode"]
    assert "no eval on cpu" in seen["reference_error"]["message"] and "outputs" not in seen, seen
    assert all(m.training for m in model.modules())  # put back
    seen = eval_mode_check(_EvalFailsOn("neuron"), (x,), {}, target=target, reference=reference)["eval_mode"]
    assert "no eval on neuron" in seen["error"]["message"], seen
    seen = eval_mode_check(_EvalFailsOn("none"), (x,), {}, target=target, reference=reference)["eval_mode"]
    assert seen["outputs"]["ok"], seen
    assert eval_mode_check(_EvalFailsOn("none").eval(), (x,), {}, target=target, reference=reference) == {}
