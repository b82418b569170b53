"""The numerics profiles compute what Trainium's documented behaviour implies."""

from __future__ import annotations

import warnings

import pytest
import torch

from emulator.profiles import ProfileError, resolve_profile


def bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def test_exact_is_bit_identical(profile):
    profile("exact")
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    assert torch.equal((a.to("neuron") @ b.to("neuron")).cpu(), a @ b)
    assert torch.equal(torch.nn.functional.gelu(a.to("neuron")).cpu(), torch.nn.functional.gelu(a))


def test_matmult_rounds_matmul_operands_to_bf16_and_accumulates_in_fp32(profile):
    profile("matmult-bf16")
    a, b = torch.randn(33, 17), torch.randn(17, 9)
    got = (a.to("neuron") @ b.to("neuron")).cpu()
    assert got.dtype == torch.float32
    assert torch.equal(got, bf16(a) @ bf16(b)), "bf16 operands, fp32 accumulation"
    assert not torch.equal(got, a @ b)
    # Element-wise ops are not on the matrix engine: untouched.
    assert torch.equal((a.to("neuron") * 3.3).cpu(), a * 3.3)
    # Linear layers (addmm) and convolutions round their operands too, not the bias.
    lin = torch.nn.Linear(17, 9)
    got = lin.to("neuron")(a.to("neuron")).cpu()
    assert torch.equal(got, torch.addmm(lin.bias.detach().cpu(), bf16(a), bf16(lin.weight.detach().cpu().t())))
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    got = torch.nn.functional.conv2d(x.to("neuron"), w.to("neuron")).cpu()
    assert torch.equal(got, torch.nn.functional.conv2d(bf16(x), bf16(w)))


@pytest.mark.parametrize("cast_type, rounder", [
    ("fp16", lambda t: t.half().float()),
    ("tf32", lambda t: torch.where(t.isfinite(), ((t.view(torch.int32) + 0xFFF + ((t.view(torch.int32) >> 13) & 1)) & ~0x1FFF).view(torch.float32), t)),
    ("fp8_e4m3", lambda t: t.clamp(-448, 448).to(torch.float8_e4m3fn).float()),
])
def test_auto_cast_types(profile, cast_type, rounder):
    profile(f"matmult-bf16:auto_cast_type={cast_type}")
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    assert torch.equal((a.to("neuron") @ b.to("neuron")).cpu(), rounder(a) @ rounder(b))


def test_auto_cast_all_rounds_every_fp32_result(profile):
    profile("all-bf16")
    a, b = torch.randn(64), torch.randn(64)
    out = (a.to("neuron") + b.to("neuron")).cpu()
    assert torch.equal(out, bf16(bf16(a) + bf16(b)))


def test_integer_matmul_is_computed_in_fp32(profile):
    big = 2**24 + 1
    a = torch.tensor([[big, 0], [0, 3]], dtype=torch.int64)
    eye = torch.eye(2, dtype=torch.int64)
    profile("exact")
    assert (a.to("neuron") @ eye.to("neuron")).cpu()[0, 0].item() == big
    profile("neuron-2.27")
    out = (a.to("neuron") @ eye.to("neuron")).cpu()
    assert out.dtype == torch.int64
    assert out[0, 0].item() == 2**24, "FP32 cannot hold 2^24 + 1"
    assert out[1, 1].item() == 3
    # scatter_add on integers too, but its index argument stays exact
    src = torch.full((4,), big, dtype=torch.int64)
    index = torch.tensor([0, 0, 1, 1])
    got = torch.zeros(2, dtype=torch.int64).to("neuron").scatter_add(0, index.to("neuron"), src.to("neuron")).cpu()
    assert got.tolist() == [2 * 2**24, 2 * 2**24]


def test_activation_tables_are_approximate_and_clamped(profile):
    x = torch.linspace(-6, 6, 4001)
    profile("neuron-2.27")
    for fn in (torch.sigmoid, torch.tanh, torch.nn.functional.gelu, torch.nn.functional.silu):
        got = fn(x.to("neuron")).cpu()
        err = (got.double() - fn(x.double())).abs().max().item()
        assert 0 < err < 1e-3, (fn, err)
    # Outside the documented range the table input is clamped: silu(20) reads the table at 16.
    far = torch.tensor([20.0, 30.0])
    assert torch.equal(torch.nn.functional.silu(far.to("neuron")).cpu(), torch.nn.functional.silu(torch.tensor([16.0, 16.0])))
    # In-place and out= variants go through the same tables.
    y = x.clone().to("neuron")
    y.sigmoid_()
    assert torch.equal(y.cpu(), torch.sigmoid(x.to("neuron")).cpu())


def test_stochastic_rounding_is_unbiased_and_seeded(profile):
    value = 1.0 + 2.0**-9  # a quarter of the way from 1.0 to the next bf16 (1 + 2^-7)
    x = torch.full((20000,), value)
    profile("exact")
    assert x.to("neuron").to(torch.bfloat16).cpu().float().unique().tolist() == [1.0]
    profile("all-bf16-sr")
    first = x.to("neuron").to(torch.bfloat16).cpu().float()
    assert set(first.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert abs(first.double().mean().item() - value) < 2e-4
    profile("all-bf16-sr")  # re-activating resets the rounding stream to its seed
    assert torch.equal(x.to("neuron").to(torch.bfloat16).cpu().float(), first)
    profile("all-bf16-sr:stochastic_rounding_seed=7")
    assert not torch.equal(x.to("neuron").to(torch.bfloat16).cpu().float(), first)


def test_coverage_gaps_run_on_the_host_tracked_and_warned_once(profile):
    profile("neuron-2.27")
    torch.neuron.clear_op_tracking()
    x = torch.rand(100).to("neuron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        h1 = torch.histc(x, bins=10)
        torch.histc(x, bins=5)
    assert torch.equal(h1.cpu(), torch.histc(x.cpu(), bins=10))
    assert h1.device.type == "neuron"
    assert "aten::histc" in torch.neuron.get_fallback_ops()
    assert "aten::histc" in torch.neuron.get_executed_ops()
    messages = [str(w.message) for w in caught if "executed via CPU fallback" in str(w.message)]
    assert len(messages) <= 1  # one warning per op type per process (maybe already given earlier)
    torch.neuron.clear_op_tracking()
    (x + 1).sum()
    assert torch.neuron.get_fallback_ops() == []


def test_unsupported_ops_raise(profile):
    profile("exact:unsupported_ops=aten::cumsum*")
    with pytest.raises(NotImplementedError, match="not currently implemented for the neuron device"):
        torch.arange(5.0).to("neuron").cumsum(0)


def test_profile_specs_and_errors(tmp_path):
    p = resolve_profile("neuron-2.27:auto_cast=matmult,stochastic_rounding=1")
    assert p.auto_cast == "matmult" and p.stochastic_rounding and p.approximate_activations
    f = tmp_path / "mine.json"
    f.write_text('{"base": "exact", "auto_cast": "all", "fallback_ops": ["aten::sort*"]}')
    p = resolve_profile(str(f))
    assert p.name == "mine" and p.auto_cast == "all" and p.fallback_ops == ("aten::sort*",)
    for bad, message in [
        ("nope", "unknown emulator profile 'nope'"),
        ("exact:auto_cast=sometimes", "auto_cast='sometimes'"),
        ("exact:colour=blue", "unknown profile field 'colour'"),
        ("exact:stochastic_rounding=maybe", "expected a boolean"),
        (str(tmp_path / "missing.json"), "not found"),
    ]:
        with pytest.raises(ProfileError, match=message):
            resolve_profile(bad)
    assert resolve_profile("exact").is_exact and not resolve_profile("neuron-2.27").is_exact


def test_compiled_graphs_narrow_64_bit_inputs(profile):
    from emulator.compile_backend import clear_compile_events, compile_events, narrowing_losses

    profile("neuron-2.27")
    torch._dynamo.reset()
    clear_compile_events()

    def f(ids, scale):
        return ids * 2, scale * 3

    compiled = torch.compile(f, backend="neuron")
    ids = torch.tensor([2**40 + 5, 7], dtype=torch.int64).to("neuron")
    scale = torch.tensor([1.0 + 2**-40], dtype=torch.float64).to("neuron")
    out_ids, out_scale = compiled(ids, scale)
    assert out_ids.dtype == torch.int64
    assert out_ids.cpu().tolist()[1] == 14
    assert out_ids.cpu().tolist()[0] != (2**40 + 5) * 2, "the high bits were lost on the way in"
    assert out_scale.cpu().item() == 3.0
    assert compile_events[-1].narrowed_inputs == (0, 1)
    assert narrowing_losses
