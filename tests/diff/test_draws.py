"""Random draws shared between sides (diff/draws.py): the target takes the reference's numbers, in eager code and
in compiled graphs, the sides' logs name where they part, and the device's own stream is modelled on the CPU."""

from __future__ import annotations

import emulator
import torch
import torch.nn.functional as F

from diff.draws import SharedDraws, StartState, first_parting, same_draws


def _program(device, dtype=torch.float32) -> list[torch.Tensor]:
    """Every kind of draw a model makes: dropout (the CPU decomposes it, a device runs native_dropout), the
    ``_like`` factories, factories with a device, in-place fills, sampling, permutations, SDPA's dropout."""
    x = torch.linspace(-1, 1, 40, dtype=dtype).reshape(5, 8).to(device)
    out = [F.dropout(x, 0.3, True), torch.randn_like(x), torch.rand(3, device=device, dtype=dtype)]
    filled = torch.empty(4, 4, device=device, dtype=dtype)
    filled.normal_()
    out.append(filled)
    out.append(torch.multinomial(torch.ones(6, device=device), 3).float())
    out.append(torch.randperm(7, device=device).float())
    out.append(torch.bernoulli(torch.full((3, 3), 0.5, device=device, dtype=dtype)))
    q = torch.linspace(0, 1, 64, dtype=dtype).reshape(1, 2, 4, 8).to(device)
    out.append(F.scaled_dot_product_attention(q, q, q, dropout_p=0.3))
    out.append(torch.randint(0, 10, (5,), device=device).float())
    return [o.cpu().double() for o in out]


def test_the_target_and_the_golden_take_the_references_draws():
    emulator.register()
    emulator.set_profile("neuron-2.27")  # a device with a random stream of its own
    try:
        state = StartState.now()
        with same_draws(state) as ref_draws:
            ref = _program("cpu")
        with same_draws(state) as tgt_draws:
            tgt = _program("neuron")
        with same_draws(state, double=True) as gold_draws:
            gold = _program("cpu", torch.float64)
        with torch.random.fork_rng(devices=[]):
            torch.random.set_rng_state(state.cpu)
            with SharedDraws() as own:  # logged only: the device draws its own numbers
                _program("neuron")
    finally:
        emulator.set_profile("exact")
    for r, t, g in zip(ref, tgt, gold):
        assert torch.equal(r, t)
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)  # float32 draws, computed on in float64
    assert len(ref_draws.log) == len(tgt_draws.log) == 9
    assert first_parting(ref_draws.log, tgt_draws.log) is None
    assert first_parting(ref_draws.log, gold_draws.log) is None
    assert tgt_draws.log.on_device == list(range(9)) and not ref_draws.log.on_device
    assert "aten::native_dropout" in tgt_draws.log.redirected
    parting = first_parting(ref_draws.log, own.log)
    assert parting is not None and parting.index == 0 and "native_dropout" in parting.describe()


def test_draws_inside_a_compiled_graph_are_shared(neuron):
    """The mode never makes dynamo skip the frame (the graph is compiled and runs compiled: a compile-only
    fault strikes), and it still gives the graph's random ops the reference's draws."""
    from emulator.compile_backend import neuron_backend

    def step(t):
        return F.dropout(t, 0.5, True) * 2 + torch.randn_like(t)

    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return neuron_backend(gm, example_inputs)

    x = torch.randn(6, 6)
    state = StartState.now()
    with same_draws(state):
        expected = step(x)
    torch._dynamo.reset()
    compiled = torch.compile(step, backend=counting)
    with same_draws(state) as drawn:
        got = compiled(x.to("neuron")).cpu()
    assert len(graphs) == 1, "compiled inside the mode, not skipped to eager"
    assert torch.equal(expected, got) and drawn.log.on_device == [0, 1]
    emulator.set_faults("perturb@aten::add,rel=0.01,mode=compile")
    with same_draws(state):
        faulty = compiled(x.to("neuron")).cpu()
    assert len(graphs) == 1 and not torch.equal(expected, faulty), "the compiled graph ran"


def test_a_script_that_draws_in_another_order_is_named_at_the_first_parting():
    state = StartState.now()
    with same_draws(state) as a:
        torch.rand(3)
        torch.randn(2, 2)
    with same_draws(state) as b:
        torch.rand(3)
        torch.randint(0, 5, (2, 2))
    parting = first_parting(a.log, b.log)
    assert parting is not None and parting.index == 1
    assert "aten::randn [2x2]" in parting.describe() and "aten::randint [2x2]" in parting.describe()
    assert "test_draws.py" in parting.describe()


def test_the_devices_own_stream_is_modelled_on_the_cpu_without_moving_its_generator():
    """A stream-K reference side: the draws the target made on the device come from a generator of their own,
    and the CPU's generator moves on as if they had not been drawn (the device's generator drew them)."""
    torch.manual_seed(3)
    with SharedDraws() as plain:
        torch.rand(4)
        second = torch.rand(4)
    torch.manual_seed(3)
    with SharedDraws(own_stream={0}, seed=1) as first_own:
        other = torch.rand(4)
        after = torch.rand(4)
    torch.manual_seed(3)
    fresh = torch.rand(4)
    assert not torch.equal(other, fresh)  # another stream for the device's draw
    assert torch.equal(after, fresh)  # the CPU's generator did not move for it
    assert not torch.equal(after, second)
    assert len(plain.log) == len(first_own.log) == 2


def _streams(program, fault: str):
    """``program``'s draw logs: on the CPU, on the device's own stream, and there again under ``fault``."""
    emulator.register()
    emulator.set_profile("neuron-2.27")  # the device draws from a stream of its own
    logs = []
    try:
        for device, faults in (("cpu", ""), ("neuron", ""), ("neuron", fault)):
            emulator.set_faults(faults)
            torch.manual_seed(0)
            logs.append(program(device).log)
    finally:
        emulator.set_faults("")
        emulator.set_profile("exact")
    return logs


def _draws_of(device, steps: int = 30) -> "SharedDraws":
    with SharedDraws() as mode:
        x = torch.zeros(64, 32, device=device)
        for _ in range(steps):
            F.dropout(x + 1, 0.3, True)
            torch.randn_like(x)
            torch.randint(0, 50, (64,), device=device)
            torch.multinomial(torch.rand(8, device=device) + 0.1, 4)  # value-dependent: not compared
    return mode


def test_the_devices_own_stream_is_compared_as_a_distribution():
    """Independent streams of one distribution never differ by STREAM_SIGMAS; a device whose normal draws
    have twice the scale does, named by op and moment."""
    from diff.draws import compare_streams

    reference, clean, scaled = _streams(_draws_of, "perturb@aten::normal_,rel=1.0")
    on_device = clean.on_device
    assert len(on_device) == 150 and first_parting(reference, clean) is not None  # rand for the probabilities too
    assert compare_streams(reference, clean, on_device) == []
    (wrong,) = compare_streams(reference, scaled, scaled.on_device)
    assert wrong.op == "aten::randn_like" and wrong.what == "variance" and 3.5 < wrong.target / wrong.reference < 4.5


def _init_draws_of(device) -> "SharedDraws":
    """DCGAN's ``weights_init``: one op drawn with other parameters at each call (convolutions around 0,
    batch norms around 1), on the device's own stream."""
    with SharedDraws() as mode:
        generator = [(100, 512), 512, (512, 256), 256, (256, 128), 128, (128, 64), 64, (64, 3)]
        discriminator = [(3, 64), (64, 128), 128, (128, 256), 256, (256, 512), 512, (512, 1)]
        for layer in generator + discriminator:  # convolutions' weights (4x4 kernels), batch norms' weights
            size, mean = (layer[0] * layer[1] * 16, 0.0) if isinstance(layer, tuple) else (layer, 1.0)
            torch.empty(size, device=device).normal_(mean, 0.02)
    return mode


def test_draws_of_one_op_with_other_parameters_are_compared_pair_by_pair():
    """Pooled, such draws make a mixture whose variance is mostly the spread between the calls' means, and a
    standard error from the within-draw moments called a clean stream 63 standard errors off. Pair by pair
    a clean stream passes, and draws 1% too wide (variance 2% too large) are still found."""
    from diff.draws import compare_streams

    reference, clean, scaled = _streams(_init_draws_of, "perturb@aten::normal_,rel=0.01")
    assert len(clean.on_device) == 17
    assert compare_streams(reference, clean, clean.on_device) == []
    (wrong,) = compare_streams(reference, scaled, scaled.on_device)
    assert wrong.op == "aten::normal_" and wrong.what == "variance", wrong


def _linear_init_draws_of(device) -> "SharedDraws":
    """A regression model initialised on the device (``torch.set_default_device``): the last Linear's bias
    is one number."""
    with SharedDraws() as mode, torch.device(device):
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return mode


def test_a_draw_of_one_number_is_no_evidence_of_another_distribution():
    """A draw of one number has no spread: its difference was "inf standard errors apart" and failed a
    correct device (Linear(32, 1)'s bias, initialised on the device). Twice the scale is still found in the
    other draws."""
    from diff.draws import compare_streams

    reference, clean, scaled = _streams(_linear_init_draws_of, "perturb@aten::uniform_,rel=1.0")
    assert len(clean.on_device) == 4 and clean.draws[clean.on_device[-1]].moments[0] == 1
    assert compare_streams(reference, clean, clean.on_device) == []
    (wrong,) = compare_streams(reference, scaled, scaled.on_device)
    assert wrong.op == "aten::uniform_" and wrong.what == "variance", wrong


def _value_dependent_draws_of(device, scale: float) -> "SharedDraws":
    """rrelu in training: its output is its input times the noise, so it depends on the input's values."""
    with SharedDraws() as mode:
        for step in range(16):
            F.rrelu(torch.linspace(-2, 1, 512).to(device) * scale * (1 + step / 16), training=True)
            torch.randn(64, device=device)
    return mode


def test_draws_whose_inputs_differ_between_the_sides_are_not_compared_as_distributions():
    """On its own stream the target's training takes another path, so a draw whose output depends on its
    inputs' values is not the same distribution on both sides even on a correct device (word_language_model's
    evaluation pass, after 12 steps at lr 20, ran attention tagged random: "the target's draws have mean 0.101
    where the reference's have 0.09491"). Only draws that depend on shapes and scalar arguments are compared."""
    from diff.draws import compare_streams

    emulator.register()
    emulator.set_profile("neuron-2.27")  # the device draws from a stream of its own
    try:
        torch.manual_seed(0)
        reference = _value_dependent_draws_of("cpu", 1.0).log
        torch.manual_seed(0)
        target = _value_dependent_draws_of("neuron", 1.2).log  # its training went elsewhere: other inputs
    finally:
        emulator.set_profile("exact")
    assert len(target.on_device) == 32
    assert compare_streams(reference, target, target.on_device) == []


class _NoisyImages(torch.utils.data.Dataset):
    """Draws while a DataLoader fetches: from a generator of its own per item, as torchvision's FakeData does
    (``restores``), or from the global one, as random augmentations do."""

    def __init__(self, restores: bool) -> None:
        self.restores = restores

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> torch.Tensor:
        if not self.restores:
            return torch.randn(3, 4, 4) * torch.rand(())
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(index)
            return torch.randn(3, 4, 4) * torch.rand(())


def _training_with_loader(num_workers: int, restores: bool) -> "SharedDraws":
    torch.manual_seed(0)
    with SharedDraws() as mode:
        model = torch.nn.Linear(16, 1)  # draws: its initialisation
        loader = torch.utils.data.DataLoader(_NoisyImages(restores), batch_size=8, shuffle=True,
                                             num_workers=num_workers)
        for step, batch in zip(range(4), loader):  # within the epoch: its end draws again, when the sampler ends
            F.dropout(model(batch.reshape(8, 3, 16)), 0.2).sum()
    return mode


def test_draws_of_a_dataset_are_not_the_models_whatever_the_loaders_workers():
    """pytorch/examples give ``num_workers=1`` only when an accelerator is present: the reference's dataset
    drew in its own process, the target's in a worker no mode sees. Logged, the reference's data draws
    misaligned the logs from the first batch on (VAE on FakeData: "the sides ask for different random numbers
    from random draw 14"). The model's draws line up whatever the loader does; where the dataset drew from
    the global generator in one process only, the generators do part, and the logs say so."""
    for restores in (True, False):
        in_process, in_workers = _training_with_loader(0, restores).log, _training_with_loader(1, restores).log
        assert [d.op for d in in_process.draws] == [d.op for d in in_workers.draws]
        # initialisation; the loader's seed, the sampler's seed and permutation; a dropout a batch
        assert len(in_process) == 2 + 3 + 4
        parting = first_parting(in_process, in_workers)
        assert (parting is None) if restores else (parting.index == 5 and parting.target.op == "aten::bernoulli_")


def test_attention_is_a_draw_only_with_dropout():
    """PyTorch tags every attention kernel random; with ``dropout_p`` 0 (given or by default) it draws nothing."""
    from diff.draws import draws

    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    q = torch.randn(1, 1, 4, 8)
    assert not draws(attention, (q, q, q), {}) and not draws(attention, (q, q, q, 0.0), {})
    assert draws(attention, (q, q, q, 0.1), {}) and draws(attention, (q, q, q), {"dropout_p": 0.2})
    assert draws(torch.ops.aten.bernoulli_.float, (q, 0.5), {})
    assert not draws(torch.ops.aten._fused_sdp_choice.default, (q, q, q), {})
    assert not draws(torch.ops.aten.add.Tensor, (q, q), {})


def _generator_program(device) -> list[torch.Tensor]:
    """A script's own generator on its device: augmentation noise, the generator seeded again each epoch, a
    state saved and put back, and a second generator inside a model."""
    noise, jitter = torch.Generator(device=device), torch.Generator(device=device)
    jitter.manual_seed(7)
    out = []
    for _ in range(2):
        noise.manual_seed(1234)
        for _ in range(3):
            saved = noise.get_state()
            out.append(torch.randn(4, 5, generator=noise, device=device))
            out.append(torch.rand(3, generator=jitter, device=device))
        noise.set_state(saved)
        out.append(torch.randn(4, 5, generator=noise, device=device))
    out.append(torch.empty(6, device=device).normal_(generator=noise))
    return [o.cpu() for o in out]


def test_a_device_generator_of_the_script_draws_the_references_numbers(neuron):
    """PyTorch hands the mode a new Python object for the script's generator at every draw: the stand-in CPU
    generator, found by that object's identity, started again from the seed at every draw, and a correct
    device was "the sides ask for different random numbers" at the second draw (NOT READY). It follows the
    reference's generator through draws, seeds and a state put back; a replay (same_draws) leaves the
    script's generators where they were."""
    state = StartState.now()
    with same_draws(state) as ref_draws:
        ref = _generator_program("cpu")
    with torch.random.fork_rng(devices=[]):
        torch.random.set_rng_state(state.cpu)
        with SharedDraws(shared=True) as tgt_draws:  # a target side's mode: for the whole script
            tgt = _generator_program("neuron")
    assert len(ref) == len(tgt) == 15
    for r, t in zip(ref, tgt):
        assert torch.equal(r, t)
    assert torch.equal(ref[0], ref[7]) and not torch.equal(ref[0], ref[2])  # seeded again; moved on
    assert torch.equal(ref[4], ref[6])  # the state put back
    assert first_parting(ref_draws.log, tgt_draws.log) is None and len(tgt_draws.log.on_device) == 15

    generator = torch.Generator(device="neuron").manual_seed(3)
    before = generator.get_state()
    with same_draws(state):
        torch.randn(8, generator=generator, device="neuron")
    assert torch.equal(generator.get_state(), before)


def test_draws_the_reference_repeats_are_counted_once():
    """A generator seeded again each epoch draws the same numbers again, on the reference and on a correct
    device alike. Counted at every repeat, one chance deviation counted three times: a correct device failed
    at 6 standard errors (here 4 draws of 16 numbers, 3.8 standard errors apart by chance, were 6.6 over
    three epochs). Counted once, they pass; a device drawing too narrow a range is still found."""
    from diff.draws import STREAM_SIGMAS, Draw, DrawLog, compare_streams

    def log(draws: list[torch.Tensor], states: list[str]) -> DrawLog:
        def moments(d):
            d = d.double()
            return float(d.numel()), float(d.mean()), float(d.var(unbiased=False)), float(((d - d.mean()) ** 4).mean())
        return DrawLog(draws=[Draw(op="aten::rand", shape=tuple(d.shape), on_device=not s, state=s, moments=moments(d))
                              for d, s in zip(draws, states)])

    torch.manual_seed(384)
    epoch_ref, epoch_tgt = [torch.rand(16) for _ in range(4)], [torch.rand(16) for _ in range(4)]  # one distribution
    states = [f"after draw {i}" for i in range(4)]
    assert compare_streams(log(epoch_ref * 3, [f"{s}, epoch {e}" for e in range(3) for s in states]),
                           log(epoch_tgt * 3, [""] * 12), range(12))[0].sigmas > STREAM_SIGMAS  # as if all new
    assert compare_streams(log(epoch_ref * 3, states * 3), log(epoch_tgt * 3, [""] * 12), range(12)) == []
    many_ref = log([torch.rand(16) for _ in range(40)], [f"m{i}" for i in range(40)])
    narrow = log([torch.rand(16) * 0.6 + 0.2 for _ in range(40)], [""] * 40)
    (wrong,) = compare_streams(many_ref, narrow, range(40))
    assert wrong.what == "variance" and wrong.target < wrong.reference
