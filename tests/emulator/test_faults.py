"""Fault injection breaks the emulated device for real."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import torch

import emulator
from emulator.faults import FaultSpecError, parse_faults
from tests.conftest import run_python


def test_perturb_scales_outputs(neuron):
    x = torch.randn(100)
    emulator.set_faults("perturb@aten::tanh,rel=0.01")
    got = torch.tanh(x.to(neuron)).cpu()
    assert torch.allclose(got, torch.tanh(x) * 1.01, rtol=0, atol=1e-7)
    assert torch.equal(torch.sigmoid(x.to(neuron)).cpu(), torch.sigmoid(x)), "other ops untouched"


def test_perturb_backward_only(neuron):
    x = torch.randn(50)
    emulator.set_faults("perturb@aten::mul*,rel=0.05,phase=backward")
    xd = x.to(neuron).requires_grad_()
    y = xd * 3.0
    assert torch.equal(y.detach().cpu(), x * 3.0), "forward untouched"
    y.sum().backward()
    assert torch.allclose(xd.grad.cpu(), torch.full((50,), 3.0 * 1.05))


def test_raise_wrong_dtype_wrong_shape_host_output(neuron):
    x = torch.randn(4, 3)
    emulator.set_faults("raise@aten::cumsum")
    with pytest.raises(RuntimeError, match="injected fault in aten::cumsum"):
        x.to(neuron).cumsum(0)
    emulator.set_faults("wrong_dtype@aten::abs")
    assert x.to(neuron).abs().dtype == torch.float64
    emulator.set_faults("wrong_shape@aten::neg")
    assert x.to(neuron).neg().shape == (1, 4, 3)
    emulator.set_faults("host_output@aten::exp")
    assert torch.exp(x.to(neuron)).device.type == "cpu"


def test_silent_host_fallback_is_tracked_without_warning(neuron):
    emulator.set_faults("host_fallback@aten::sin")
    torch.neuron.clear_op_tracking()
    out = torch.sin(torch.randn(5).to(neuron))
    assert out.device.type == "neuron"
    assert torch.neuron.get_fallback_ops() == ["aten::sin"]


def test_dtype_filter_and_probability(neuron):
    emulator.set_faults("perturb@aten::mul*,rel=0.5,dtype=float64")
    assert torch.equal((torch.ones(2).to(neuron) * 2).cpu(), torch.full((2,), 2.0))
    assert torch.equal((torch.ones(2, dtype=torch.float64).to(neuron) * 2).cpu(), torch.full((2,), 3.0, dtype=torch.float64))
    assert emulator.set_faults("raise@aten::add*,p=0") == [], "p=0: never active"
    torch.ones(2).to(neuron) + 1


def test_a_flaky_fault_is_drawn_again_in_each_forked_child():
    """``p=0.5`` is a chance per process. Workers forked from one preloaded parent (runner.zygote) are processes
    of their own: they must not all inherit the parent's draw (a gate's reruns would then all meet the fault,
    or all miss it). 24 children of one parent agree by chance with probability 2 / 2**24."""
    code = (
        "import os, emulator\n"
        "emulator.register(faults='perturb@aten::tanh,rel=0.5,p=0.5')\n"
        "seen = []\n"
        "for _ in range(24):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        os._exit(10 + len(emulator.active_faults()))\n"
        "    seen.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))\n"
        "print(sorted(set(seen)))\n"
    )
    result = run_python(code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[10, 11]", result.stdout


@pytest.mark.parametrize("spec, expected", [
    ("crash@aten::cumsum", -signal.SIGSEGV),
    ("abort@aten::cumsum", -signal.SIGABRT),
])
def test_crash_kills_the_process(spec, expected):
    result = run_python("import torch; torch.arange(3.).to('neuron').cumsum(0); print('survived')",
                        env={"NEURON_VALIDATE_FAULTS": spec})
    assert result.returncode == expected
    assert "survived" not in result.stdout


def test_hang_never_returns():
    # The child says when it calls the op (its start-up is not timed); a 3-element cumsum that returned at all
    # would print again within microseconds, so 5 s of silence from there is a hang on any machine.
    code = ("import torch; x = torch.arange(3.).to('neuron'); print('calling', flush=True); x.cumsum(0); "
            "print('returned', flush=True)")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**__import__("os").environ, "NEURON_VALIDATE_FAULTS": "hang@aten::cumsum"})
    try:
        assert child.stdout.readline() == "calling\n"
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=5)
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("spec, message", [
    ("perturb", "must look like KIND@OP"),
    ("explode@aten::add", "unknown fault kind"),
    ("perturb@aten::add,rel=lots", "expected a number"),
    ("perturb@aten::add,colour=red", "unknown fault option"),
    ("perturb@aten::add,phase=later", "phase='later'"),
    ("perturb@aten::add,p=2", "must lie in"),
])
def test_bad_fault_specs(spec, message):
    with pytest.raises(FaultSpecError, match=message):
        parse_faults(spec)
