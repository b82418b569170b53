"""The emulated device behaves like a real device for user code."""

from __future__ import annotations

import io

import pytest
import torch

from tests.conftest import run_python


def test_tensors_live_on_the_device(neuron):
    x = torch.ones(2).to("neuron")
    assert x.device == torch.device("neuron", 0)
    assert x.is_neuron
    assert (x * 3).device.type == "neuron"
    assert torch.equal(x.cpu(), torch.ones(2))


def test_views_alias_and_inplace_ops_mutate(neuron):
    base = torch.arange(12.0, device=neuron)
    x = base.view(3, 4)
    column = x[:, 1]
    column.mul_(10)
    assert x._base is base and column._base is base
    assert x[2, 1].item() == 90.0
    assert base[9].item() == 90.0
    x.t().add_(1)  # in place through a transposed view
    assert torch.equal(base.cpu(), torch.arange(12.0).index_put((torch.tensor([1, 5, 9]),), torch.tensor([10.0, 50.0, 90.0])) + 1)
    assert x.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()


def test_data_ptr_is_stable_and_offset_for_views(neuron):
    x = torch.zeros(8, device=neuron, dtype=torch.float32)
    ptr = x.data_ptr()
    assert ptr != 0
    assert x[3:].data_ptr() == ptr + 3 * 4
    x.add_(1)
    assert x.data_ptr() == ptr


def test_out_variants_resize_their_output(neuron):
    a = torch.randn(3, 4, device=neuron)
    out = torch.empty(0, device=neuron)
    torch.add(a, a, out=out)
    assert out.shape == (3, 4) and out.device.type == "neuron"
    assert torch.equal(out.cpu(), (a + a).cpu())


def test_module_to_optimizer_and_autograd(neuron):
    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    model.load_state_dict(cpu_model.state_dict())
    weight = model[0].weight
    model.to("neuron")
    assert model[0].weight is weight, "Module.to keeps parameter objects, so tied weights stay tied"
    x = torch.randn(16, 4)
    for m, inputs in ((cpu_model, x), (model, x.to(neuron))):
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
        for _ in range(3):
            opt.zero_grad()
            m(inputs).pow(2).mean().backward()
            opt.step()
    assert model[0].weight.grad.device.type == "neuron"
    for p_cpu, p_dev in zip(cpu_model.parameters(), model.parameters()):
        assert torch.equal(p_cpu, p_dev.cpu())


def test_save_and_load_weights_only_round_trip(neuron):
    model = torch.nn.Linear(3, 2).to(neuron)
    buffer = io.BytesIO()
    torch.save({"state": model.state_dict(), "step": 7}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    assert loaded["step"] == 7
    assert loaded["state"]["weight"].device.type == "neuron"
    assert torch.equal(loaded["state"]["weight"].cpu(), model.weight.detach().cpu())
    buffer.seek(0)
    on_cpu = torch.load(buffer, weights_only=True, map_location="cpu")
    assert on_cpu["state"]["bias"].device.type == "cpu"


def test_torch_accelerator(neuron):
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("neuron")
    assert torch.accelerator.device_count() == 1
    torch.accelerator.synchronize()
    assert torch.accelerator.current_device_index() == 0


def test_timing_events_measure_the_work_between_them(neuron):
    """``torch.cuda.Event(enable_timing=True)`` timing of a training step, as public scripts log images a second:
    an event is timed when recorded (the device works synchronously), never 0 ms, and misuse raises as on
    CUDA."""
    start, end = torch.neuron.Event(enable_timing=True), torch.neuron.Event(enable_timing=True)
    x = torch.randn(256, 256, device=neuron)
    start.record()
    for _ in range(20):
        x = torch.tanh(x @ x)
    end.record()
    end.synchronize()
    assert start.query() and end.query()
    assert start.elapsed_time(end) > 0.0
    stream_event = torch.neuron.current_stream().record_event(torch.neuron.Event(enable_timing=True))
    assert start.elapsed_time(stream_event) >= start.elapsed_time(end)
    with pytest.raises(ValueError, match="must be recorded"):
        start.elapsed_time(torch.neuron.Event(enable_timing=True))
    untimed = torch.neuron.Event()
    untimed.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        start.elapsed_time(untimed)


def test_autocast_on_the_device(neuron):
    a = torch.randn(4, 4, device=neuron)
    with torch.autocast(device_type="neuron", dtype=torch.bfloat16):
        y = a @ a
        s = torch.log_softmax(y, dim=-1)
    assert y.dtype == torch.bfloat16
    assert s.dtype == torch.float32  # an fp32-policy op


def test_manual_seed_makes_device_randomness_reproducible(neuron):
    torch.manual_seed(123)
    a = torch.randn(5, device=neuron)
    torch.manual_seed(123)
    b = torch.randn(5, device=neuron)
    assert torch.equal(a.cpu(), b.cpu())
    g = torch.Generator(device="neuron").manual_seed(5)
    c = torch.rand(3, device=neuron, generator=g)
    g.manual_seed(5)
    assert torch.equal(c.cpu(), torch.rand(3, device=neuron, generator=g).cpu())
    state = torch.neuron.get_rng_state()
    d = torch.rand(4, device=neuron)
    torch.neuron.set_rng_state(state)
    assert torch.equal(d.cpu(), torch.rand(4, device=neuron).cpu())


def test_a_device_generator_deep_copies_and_pickles_with_its_position(neuron):
    """As a CUDA generator does: timm's ModelEmaV3 keeps one for stochastic rounding, so a training task that
    holds it could not be copied ("CPU Generator does not use offset"), and its layers were never compared."""
    import copy
    import pickle

    g = torch.Generator(device="neuron").manual_seed(5)
    torch.rand(3, device=neuron, generator=g)
    copies = [copy.deepcopy(g), pickle.loads(pickle.dumps(g))]
    expected = torch.rand(4, device=neuron, generator=g).cpu()
    for h in copies:
        assert h.device == g.device and h.initial_seed() == 5
        assert torch.equal(torch.rand(4, device=neuron, generator=h).cpu(), expected)


def test_seeds_beyond_int64_are_accepted_like_cpu(neuron):
    # torch.seed() returns an unsigned 64-bit value; models (Reformer) reseed with it
    big = 2**64 - 5
    torch.manual_seed(big)
    assert torch.neuron.initial_seed() == torch.initial_seed() == big
    a = torch.randn(3, device=neuron)
    torch.manual_seed(big)
    assert torch.equal(a.cpu(), torch.randn(3, device=neuron).cpu())


def test_device_random_stream_is_separate_under_a_device_profile(profile):
    profile("neuron-2.27")
    torch.manual_seed(0)
    on_device = torch.rand(64, device="neuron").cpu()
    torch.manual_seed(0)
    on_cpu = torch.rand(64)
    assert not torch.equal(on_device, on_cpu)
    profile("exact")
    torch.manual_seed(0)
    assert torch.equal(torch.rand(64, device="neuron").cpu(), torch.rand(64, generator=torch.Generator().manual_seed(0)))


def test_dropout_draws_from_the_device_stream(profile):
    """native_dropout's CPU kernel takes no generator; on the device it must still use the device's stream."""
    x = torch.ones(4096)
    q = torch.randn(1, 2, 16, 8)

    def masks(device):
        torch.manual_seed(0)
        drop = torch.nn.functional.dropout(x.to(device), 0.5).cpu()
        attn = torch.nn.functional.scaled_dot_product_attention(*(q.to(device),) * 3, dropout_p=0.5).cpu()
        return drop, attn

    profile("neuron-2.27")
    cpu_drop, cpu_attn = masks("cpu")
    dev_drop, dev_attn = masks("neuron")
    assert not torch.equal(dev_drop, cpu_drop), "dropout masks must differ from the CPU's under the device profile"
    assert not torch.equal(dev_attn, cpu_attn), "so must SDPA's attention dropout"
    assert 0.45 < float((dev_drop > 0).float().mean()) < 0.55
    assert torch.equal(masks("neuron")[0], dev_drop), "reproducible from the seed"
    torch.manual_seed(0)
    before = torch.rand(8)
    torch.manual_seed(0)
    torch.nn.functional.dropout(x.to("neuron"), 0.5)
    assert torch.equal(torch.rand(8), before), "the device's dropout leaves the CPU's stream alone"
    profile("exact")
    assert torch.equal(masks("neuron")[0], cpu_drop), "exact: the device's stream starts where the CPU's does"


def test_torch_compile_with_the_neuron_backend(neuron):
    from emulator.compile_backend import clear_compile_events, compile_events

    clear_compile_events()
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(neuron)
    compiled = torch.compile(model, backend="neuron")
    x = torch.randn(4, 8, device=neuron, requires_grad=True)
    y = compiled(x)
    y.sum().backward()
    assert y.device.type == "neuron" and x.grad is not None
    assert torch.equal(y.detach().cpu(), model(x).detach().cpu())
    compiled(torch.randn(5, 8, device=neuron))
    assert [e.input_shapes[2] for e in compile_events] == [(4, 8), (5, 8)], "one graph per input shape"


def test_unchanged_script_works_without_any_import(tmp_path):
    script = tmp_path / "user.py"
    script.write_text("import torch\nx = torch.ones(2).to('neuron')\nprint(x.device, torch.accelerator.current_accelerator())\n")
    result = run_python(open(script).read())
    assert result.returncode == 0, result.stderr
    assert "neuron:0 neuron" in result.stdout


def test_autoload_can_be_switched_off():
    """Without autoload nothing renames PrivateUse1, so torch does not know the device name at all (any other
    failure, an import error say, would name neuron too: the message must be torch's own for that)."""
    result = run_python("import torch; torch.ones(2).to('neuron')", env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: Expected one of ") and last.endswith(
        "device type at start of device string: neuron"), result.stderr[-2000:]
    assert "privateuseone" in last, "PrivateUse1 keeps its own name: no backend registered"


def test_plain_python_honours_the_profile_variable():
    code = "import torch\nimport emulator\nprint(emulator.profile().name)"
    result = run_python(code, env={"NEURON_VALIDATE_EMULATOR_PROFILE": "matmult-bf16"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "matmult-bf16"


def test_emulator_stands_aside_when_privateuse1_is_claimed():
    code = (
        "import torch\n"
        "torch.utils.rename_privateuse1_backend('otherdev')\n"
        "import emulator\n"
        "print(emulator.unavailable_reason())\n"
        "try:\n    emulator.register()\nexcept emulator.EmulatorUnavailable as e:\n    print('refused:', e)\n"
    )
    result = run_python(code, env={"NEURON_VALIDATE_EMULATOR_AUTOLOAD": "0"})
    assert result.returncode == 0, result.stderr
    assert "claimed by the 'otherdev' backend" in result.stdout
    assert "refused:" in result.stdout


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64, torch.bool])
def test_dtypes_round_trip(neuron, dtype):
    x = (torch.arange(6) % 3).to(dtype)
    assert torch.equal(x.to(neuron).cpu(), x)


def test_a_script_ending_in_backward_exits_cleanly():
    result = run_python("import torch\nx = torch.randn(3, device='neuron', requires_grad=True)\n(x * 2).sum().backward()\n")
    assert result.returncode == 0, result.stderr


def test_zero_gradients_are_real_zeros(neuron):
    x = torch.randn(4, device=neuron, requires_grad=True)
    torch.sgn(x).sum().backward()  # the CPU answers with a storage-less ZeroTensor
    assert torch.equal(x.grad.cpu(), torch.zeros(4))


@pytest.mark.parametrize("cell", ["GRU", "LSTM", "GRUCell", "LSTMCell", "RNN"])
def test_recurrent_layers_train_on_the_device(neuron, cell):
    from diff import compare

    torch.manual_seed(0)
    layer = getattr(torch.nn, cell)(4, 8)
    x = torch.randn(5, 3, 4) if not cell.endswith("Cell") else torch.randn(3, 4)
    results = []
    for device in ("cpu", "neuron"):
        m = __import__("copy").deepcopy(layer).to(device)
        xd = x.detach().to(device).requires_grad_()
        out = m(xd)
        out = out[0] if isinstance(out, tuple) else out
        out.square().sum().backward()
        results.append([out.detach().cpu(), xd.grad.cpu()] + [p.grad.cpu() for p in m.parameters()])
    assert compare(results[1], results[0]), "fused cells on the device agree with the CPU's unfused ones"


def test_integer_histc_runs_on_the_device_as_on_accelerators(neuron):
    # CPU has no integer histc; Hugging Face MoE layers call it on int expert indices off the CPU
    x = torch.tensor([0, 1, 1, 3, 2, 3, 3], dtype=torch.int32)
    counts = torch.histc(x.to(neuron), bins=4, min=0, max=3)
    assert counts.dtype == torch.int32 and counts.device.type == "neuron"
    assert counts.cpu().tolist() == [1, 2, 1, 3]
