"""Random draws shared between the sides of a comparison, and the device's own stream modelled on the CPU.

A model that draws random numbers (dropout masks, a VAE's ``randn_like``, a
diffusion loop's noise and timesteps, sampled actions) computes something
different on every side unless every side draws the same numbers. So, for
every comparison that must be deterministic, every side takes the
reference's draws: under :class:`SharedDraws` each random ATen op (tagged
``nondeterministic_seeded``: bernoulli, rand/randn/randint and their
``_like``, randperm, normal_, uniform_, exponential_, multinomial, dropout,
SDPA's dropout, ...) draws from the CPU's generator, as the reference's
does, in float32 where a golden side computes in float64, and its result is
moved to the op's device. The target's random kernels are then not what is
judged: the numbers downstream of them are, like any other op's (dynamo's
accuracy runner does the same on one device with ``fallback_random``). It
works in eager code and inside compiled graphs (the mode sees the graph's
ATen ops as they run; inductor needs ``fallback_random``).

Every side keeps a :class:`DrawLog`: one entry per draw with the op, its
shape, whether it ran off the CPU, the line that asked for it, and a digest
of the generator's state after it. Two sides drew the same numbers exactly
when their digests agree; :func:`first_parting` names the first draw where
they do not (the script branched differently on the device), which is a
finding, never a crash and never a silent fall back to the device's numbers.

The device's own stream is judged apart, as a distribution: the reference
runs again with the draws the target made on the device (``own_stream``, by
their index in the log) taken from a generator of their own, seeded per run,
while the CPU's generator moves on as the device's would leave it: untouched.
"""

from __future__ import annotations

import hashlib
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from conformance.seeding import host_generator_state, set_host_generator_state

RANDOM_TAG = torch.Tag.nondeterministic_seeded
# Tagged, but they draw nothing themselves (a kernel choice).
NOT_DRAWS = frozenset({"aten::_fused_sdp_choice"})
_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_DATA_FETCH = os.path.join(_TORCH, "utils", "data", "_utils", "fetch.py")


def draws(func, args=(), kwargs=None) -> bool:
    """Whether this call of an ATen op draws random numbers from a generator.

    PyTorch tags every attention kernel random for its dropout, but one called with ``dropout_p=0`` (an
    evaluation pass, a model without attention dropout: most of them) draws nothing. Taken for a draw, the
    target's attention would be computed on the CPU (SharedDraws) and never judged: a device attention 5%
    off passed the migration check of a model whose attention has no dropout."""
    if RANDOM_TAG not in func.tags or func._schema.name in NOT_DRAWS:
        return False
    for index, argument in enumerate(func._schema.arguments):
        if argument.name == "dropout_p":
            if kwargs and "dropout_p" in kwargs:
                value = kwargs["dropout_p"]
            elif index < len(args) and not argument.kwarg_only:
                value = args[index]
            else:
                value = argument.default_value
            return value is None or value != 0
    return True


@dataclass(frozen=True, slots=True)
class Draw:
    """One random op as a side ran it: ``state`` digests the generator after the draw; ``moments`` are the
    count, mean, variance and fourth central moment of what it drew (for dropout: of its mask), so that two
    streams can be compared as distributions without shipping the values."""

    op: str
    shape: tuple[int, ...]
    on_device: bool
    state: str
    where: str = ""
    moments: tuple[float, float, float, float] | None = None

    def describe(self) -> str:
        shape = "x".join(str(s) for s in self.shape) or "scalar"
        return f"{self.op} [{shape}]" + (f" at {self.where}" if self.where else "")

    def to_list(self) -> list:
        return [self.op, list(self.shape), self.on_device, self.state, self.where,
                list(self.moments) if self.moments else None]

    @classmethod
    def from_list(cls, data: list) -> "Draw":
        op, shape, on_device, state, where, moments = (list(data) + [None])[:6]
        return cls(op=op, shape=tuple(shape), on_device=bool(on_device), state=state, where=where,
                   moments=tuple(moments) if moments else None)


@dataclass(slots=True)
class DrawLog:
    """The draws of one side, in order."""

    draws: list[Draw] = field(default_factory=list)
    redirected: set[str] = field(default_factory=set)  # device ops whose draw was taken on the CPU
    # Device ops whose draw could not be taken on the CPU (a device-only kernel such as CUDA's flash
    # attention with dropout): they drew from the device's own stream, and the logs part there.
    unshared: set[str] = field(default_factory=set)

    def __len__(self) -> int:
        return len(self.draws)

    @property
    def on_device(self) -> list[int]:
        """Indices of the draws made on a device other than the CPU."""
        return [i for i, d in enumerate(self.draws) if d.on_device]

    def to_dict(self) -> dict:
        return {"draws": [d.to_list() for d in self.draws], "redirected": sorted(self.redirected),
                "unshared": sorted(self.unshared)}

    @classmethod
    def from_dict(cls, data: dict | None) -> "DrawLog":
        data = data or {}
        return cls(draws=[Draw.from_list(d) for d in data.get("draws", ())], redirected=set(data.get("redirected", ())),
                   unshared=set(data.get("unshared", ())))


@dataclass(frozen=True, slots=True)
class Parting:
    """The first draw at which two sides asked for different random numbers."""

    index: int
    reference: Draw | None
    target: Draw | None

    def describe(self) -> str:
        ref = self.reference.describe() if self.reference else "nothing more"
        tgt = self.target.describe() if self.target else "nothing more"
        return f"random draw {self.index + 1}: the reference drew {ref}; the target drew {tgt}"


def first_parting(reference: DrawLog, target: DrawLog) -> Parting | None:
    """The first draw where the two logs' generator states differ (None: every draw was the same)."""
    for i in range(max(len(reference), len(target))):
        r = reference.draws[i] if i < len(reference) else None
        t = target.draws[i] if i < len(target) else None
        if r is None or t is None or r.state != t.state or r.shape != t.shape:
            return Parting(index=i, reference=r, target=t)
    return None


# The output that carries the draw, where it is not the first (dropout's mask: the CPU's decomposition draws
# it with bernoulli_, a device's native_dropout returns it second).
_DRAWN_OUTPUT = {"aten::native_dropout": 1, "aten::_fused_dropout": 1}
# Draws whose distribution depends on nothing but shapes and scalar arguments: only theirs are compared as
# distributions. Any other draw (probabilities, rates or means given as tensors; attention with dropout, whose
# output is the attention's; rrelu's noise times its input) depends on its inputs' values, which differ on a
# side whose training took another path, as the target's own stream does.
_SHAPE_ONLY = frozenset({
    "aten::rand", "aten::rand_like", "aten::randn", "aten::randn_like", "aten::randint", "aten::randint_like",
    "aten::randperm", "aten::uniform_", "aten::uniform", "aten::normal_", "aten::normal_functional",
    "aten::exponential_", "aten::exponential", "aten::geometric_", "aten::geometric", "aten::log_normal_",
    "aten::log_normal", "aten::cauchy_", "aten::cauchy", "aten::random_", "aten::random",
    "aten::native_dropout", "aten::_fused_dropout"})  # the dropouts' masks (_DRAWN_OUTPUT)


def _shape_only(func) -> bool:
    name, overload = func._schema.name, func._schema.overload_name
    if "Tensor" in overload:  # a parameter given as a tensor (normal's mean, bernoulli_'s p, randint_like's high)
        return False
    if name == "aten::bernoulli":
        return overload in ("p", "float_out")  # the others draw with probabilities from self's values
    return name in _SHAPE_ONLY or name in ("aten::normal", "aten::bernoulli_")  # normal.float_float, bernoulli_.float


def _moments(func, out) -> tuple[float, float, float, float] | None:
    """(n, mean, variance, fourth central moment) of the drawn values, in float64 (None where the draw's
    distribution depends on its inputs' values)."""
    op = func._schema.name
    if not _shape_only(func):
        return None
    leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
    index = _DRAWN_OUTPUT.get(op, 0)
    if index >= len(leaves) or leaves[index].numel() == 0 or leaves[index].is_complex():
        return None
    with torch.no_grad():
        values = leaves[index].detach().to("cpu", torch.float64).reshape(-1)
        if not bool(torch.isfinite(values).all()):
            return None
        mean = values.mean()
        centred = values - mean
        return (float(values.numel()), float(mean), float((centred ** 2).mean()), float((centred ** 4).mean()))


@dataclass(frozen=True, slots=True)
class StreamDifference:
    """An op whose draws on the target's own stream do not follow the reference's distribution."""

    op: str
    what: str  # "mean" | "variance"
    target: float
    reference: float
    sigmas: float
    draws: int

    def describe(self) -> str:
        return (f"{self.op}: the target's draws have {self.what} {self.target:.4g} where the reference's have "
                f"{self.reference:.4g} ({self.sigmas:.0f} standard errors apart, over {self.draws} draws)")


STREAM_SIGMAS = 6.0  # how far apart two streams' moments must be to differ: independent streams stay within


def _pooled(moments: list[tuple[float, float, float, float]]) -> tuple[float, float]:
    """The mean and variance of all the values of several draws together (what the report shows)."""
    n = sum(m[0] for m in moments)
    mean = sum(m[0] * m[1] for m in moments) / n
    var = sum(m[0] * (m[2] + (m[1] - mean) ** 2) for m in moments) / n
    return mean, var


def _combined_sigmas(pairs: list[tuple[float, float, float]]) -> float:
    """Standard errors apart, over paired draws: each pair's difference ``(d, se, n)`` in its own standard
    errors, combined with weights sqrt(n) (Stouffer's). A wrong scale or rate moves every pair the same way
    and adds up; independent streams of one distribution stay within a few. inf where a pair differs with
    no spread at all (a constant draw that is another constant)."""
    import math

    total = weight = 0.0
    for d, se, n in pairs:
        if se == 0:
            if d != 0:
                return math.inf
            continue
        w = math.sqrt(n)
        total += w * d / se
        weight += w * w
    return abs(total) / math.sqrt(weight) if weight else 0.0


def compare_streams(reference: DrawLog, target: DrawLog, indices) -> list[StreamDifference]:
    """The target's draws at ``indices`` (those it made on the device, on its own stream) against the
    reference's at the same indices, op by op: each draw's mean and variance against the paired reference
    draw's, in standard errors of that pair, combined over the op's draws. Independent streams of one
    distribution differ by a few standard errors; STREAM_SIGMAS more is a device whose random op draws from
    another distribution (a wrong scale, a wrong dropout rate).

    Draws are compared pair by pair, not pooled: one op drawn with other parameters at each call (DCGAN's
    ``normal_(0, 0.02)`` for convolutions and ``normal_(1, 0.02)`` for batch norms) pools into a mixture
    whose variance is mostly the spread between the calls' means, which no within-draw moment bounds."""
    import math

    by_op: dict[str, tuple[list, list]] = {}
    drawn_before: set[tuple] = set()
    for i in indices:
        if i >= len(reference) or i >= len(target):
            break
        r, t = reference.draws[i], target.draws[i]
        if r.shape != t.shape:
            break  # the sides parted: what follows is not paired
        if r.moments is None or t.moments is None:
            continue
        if r.state:
            # The reference's generator left where an earlier draw of the op left it: the same numbers again (a
            # generator seeded again each epoch, or a state put back). Counted twice, one sample's deviation
            # would count twice; a correct device that repeats them too failed at 6 standard errors.
            repeat = (r.op, r.shape, r.state)
            if repeat in drawn_before:
                continue
            drawn_before.add(repeat)
        pair = by_op.setdefault(t.op, ([], []))
        pair[0].append(r.moments)
        pair[1].append(t.moments)
    found = []
    for op, (ref_m, tgt_m) in by_op.items():
        means, variances = [], []
        for (n_r, mean_r, var_r, m4_r), (n_t, mean_t, var_t, m4_t) in zip(ref_m, tgt_m):
            n = min(n_r, n_t)
            if n < 2:
                # One number has no spread to measure a difference by (a Linear(d, 1)'s bias, initialised on
                # the device: "inf standard errors apart" failed a correct device); its draw tells nothing.
                continue
            means.append((mean_t - mean_r, math.sqrt(var_r / n_r + var_t / n_t), n))
            # The variance's standard error: sqrt((m4 - var^2) / n) for each side.
            variances.append((var_t - var_r, math.sqrt(max(m4_r - var_r ** 2, 0.0) / n_r
                                                       + max(m4_t - var_t ** 2, 0.0) / n_t), n))
        mean_r, var_r = _pooled(ref_m)
        mean_t, var_t = _pooled(tgt_m)
        for what, pairs, target_value, reference_value in (("mean", means, mean_t, mean_r),
                                                           ("variance", variances, var_t, var_r)):
            sigmas = _combined_sigmas(pairs)
            if sigmas > STREAM_SIGMAS:
                found.append(StreamDifference(op=op, what=what, target=target_value, reference=reference_value,
                                              sigmas=sigmas, draws=len(tgt_m)))
                break
    return found


def _digest(generator: torch.Generator) -> str:
    state = generator.get_state()
    return hashlib.blake2b(state.numpy().tobytes(), digest_size=8).hexdigest()


def _fetching_data() -> bool:
    """Whether a DataLoader is fetching a batch in this process (its dataset and collate run under it).

    Such draws are data, not the model's randomness, and where they run depends on ``num_workers``: in this
    process with none, in worker processes (which no mode sees) with some. pytorch/examples' scripts give
    ``num_workers=1`` only when an accelerator is present, so the reference logged its dataset's draws and
    the target did not: the logs were misaligned from the first batch on (a false "the sides ask for
    different random numbers", and the device's own draws looked up at the wrong indices). They are left
    to the dataset; whether both sides got the same data is the same-start check's to say."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == _DATA_FETCH:
            return True
        frame = frame.f_back
    return False


def _caller(source_files: tuple[str, ...]) -> str:
    """The line that asked for the draw: a user's file first, else the first frame outside torch and this package."""
    frame = sys._getframe(2)
    fallback = ""
    while frame is not None:
        name = frame.f_code.co_filename
        if name in source_files:
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        if not fallback and not name.startswith((_TORCH, _HERE, "<")):
            fallback = f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return fallback


def _generator_slot(func) -> tuple[int | None, bool]:
    """(position, keyword only) of the op's generator argument; (None, False) when it takes none."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.name == "generator":
            return i, arg.kwarg_only
    return None, False


def _given_generator(func, args, kwargs) -> torch.Generator | None:
    index, kwarg_only = _generator_slot(func)
    if index is None:
        return None
    if "generator" in kwargs:
        return kwargs["generator"]
    return args[index] if not kwarg_only and index < len(args) else None


def _with_generator(func, args: tuple, kwargs: dict, generator: torch.Generator) -> tuple[tuple, dict]:
    index, kwarg_only = _generator_slot(func)
    if index is None:
        return args, kwargs
    if not kwarg_only and index < len(args):
        args = (*args[:index], generator, *args[index + 1:])
        return args, kwargs
    return args, {**kwargs, "generator": generator}


def _device_of(args, kwargs) -> torch.device:
    device = kwargs.get("device")
    if device is not None:
        return torch.device(device)
    for t in tree_leaves((args, kwargs)):
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


SHADOW_STATES = 1024  # stand-in states kept per mode: a script may rewind a device generator that far (set_state)


class _GeneratorShadows:
    """CPU generators standing in for the device generators a script made (``torch.Generator(device=...)``).

    On the reference the script's generator is a CPU generator seeded alike, so the target's draws from its
    device generator are taken from a CPU generator that follows the same stream. PyTorch hands the mode a
    new Python object for the same generator at every call, so a stand-in is found by where the device
    generator is: each draw moves the device generator on by one small draw of its own, and the stand-in's
    state is kept under the device generator's state after it. A script that seeds its generator again, or
    sets a state it saved, finds the stand-in where the reference's generator is then: at the seed's start,
    or where it was. A device generator whose state cannot be read is followed by its seed alone.
    """

    def __init__(self, *, keep_moves: bool = False) -> None:
        from collections import OrderedDict

        self._states: OrderedDict[tuple, torch.Tensor] = OrderedDict()
        self.keep_moves = keep_moves  # to put the device generators back (put_back)
        self._moved: list[tuple[torch.Generator, torch.Tensor]] = []  # (device generator, state before), in order

    @staticmethod
    def _key(generator: torch.Generator) -> tuple:
        try:
            return str(generator.device), _digest(generator)
        except (RuntimeError, NotImplementedError, TypeError):
            return str(generator.device), "seed", generator.initial_seed()

    def stand_in(self, generator: torch.Generator) -> tuple[torch.Generator, tuple]:
        """A CPU generator where the reference's generator is at this point of the device generator's stream,
        and the device generator's key there (for :meth:`drew`)."""
        key = self._key(generator)
        shadow = torch.Generator()
        state = self._states.get(key)
        if state is None:
            shadow.manual_seed(generator.initial_seed())  # seeded (or set to a state never seen): its seed's start
        else:
            shadow.set_state(state)
        return shadow, key

    def drew(self, generator: torch.Generator, shadow: torch.Generator, key: tuple) -> None:
        """The stand-in drew: the device generator moves on, and the stand-in's state is kept under its next state."""
        if len(key) == 2:
            try:
                before = generator.get_state() if self.keep_moves else None
                torch.empty(1, device=generator.device).uniform_(generator=generator)
                if before is not None:
                    self._moved.append((generator, before))
                key = self._key(generator)
            except (RuntimeError, NotImplementedError):
                pass
        self._states[key] = shadow.get_state()
        self._states.move_to_end(key)
        while len(self._states) > SHADOW_STATES:
            self._states.popitem(last=False)

    def put_back(self) -> None:
        """Every device generator as it was before this mode moved it."""
        for generator, state in reversed(self._moved):
            generator.set_state(state)
        self._moved.clear()


class SharedDraws(TorchDispatchMode):
    """Every random op draws from the CPU's generator (see the module docstring), and is logged.

    ``shared``: draws on another device (or, with ``draw_dtype``, in a dtype it
    maps, float64 -> float32 for a golden side) are taken on the CPU and moved
    back: the side then draws the reference's numbers. A reference side needs
    neither: it is logged only. ``own_stream``: indices of draws taken from a
    generator of their own (seeded by ``seed`` and the index) instead, the
    CPU's generator left where it was: the device's own stream, modelled on
    the reference. ``source_files``: the user's files, preferred when naming
    the line of a draw. ``restore_generators``: device generators the script
    made are put back as they were when the mode ends (a replay of one call
    must not move the run's streams on).
    """

    def __init__(self, *, shared: bool = False, draw_dtype: dict | None = None, own_stream=frozenset(), seed: int = 0,
                 source_files=(), restore_generators: bool = False) -> None:
        super().__init__()
        self.shared = shared
        self.draw_dtype = dict(draw_dtype or {})
        self.own_stream = frozenset(own_stream)
        self.seed = seed
        self.source_files = tuple(os.path.abspath(f) for f in source_files)
        self.log = DrawLog()
        # A CPU generator's state standing in for a device generator the script made, by where that generator
        # is (_GeneratorShadows); the device generators this mode advanced, to put back (restore_generators).
        self._shadows = _GeneratorShadows(keep_moves=restore_generators)
        self.restore_generators = restore_generators

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        """Off while torch.compile traces, on while the compiled graphs run: the mode must never make dynamo
        skip a frame (a compiled model would then run eagerly, and a compiler bug pass unseen), and it still
        sees the random ops a compiled graph runs (inductor's through ``fallback_random``)."""
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not draws(func, args, kwargs) or _fetching_data():
            return func(*args, **kwargs)
        index = len(self.log)
        device = _device_of(args, kwargs)
        on_device = device.type != "cpu"
        generator = _given_generator(func, args, kwargs)
        if index in self.own_stream:
            own = torch.Generator().manual_seed((self.seed * 1_000_003 + index * 7919) % 2**63)
            args, kwargs = _with_generator(func, args, kwargs, own)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(own.initial_seed())
                out = func(*args, **kwargs)
            used = own
        elif self.shared and (on_device or self._maps_dtype(func, args, kwargs)):
            try:
                out, used = self._on_cpu(func, args, kwargs, device, generator)
                self.log.redirected.add(func._schema.name)
            except (RuntimeError, NotImplementedError):  # no CPU kernel: the device draws, and the logs part
                self.log.unshared.add(func._schema.name)
                out = func(*args, **kwargs)
                used = generator if generator is not None else torch.default_generator
        else:
            out = func(*args, **kwargs)
            used = generator if generator is not None else torch.default_generator
        first = next((t for t in tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        self.log.draws.append(Draw(op=func._schema.name, shape=tuple(first.shape) if first is not None else (),
                                   on_device=on_device, state=_digest(used) if used.device.type == "cpu" else "",
                                   where=_caller(self.source_files), moments=_moments(func, out)))
        return out

    def __exit__(self, *exc) -> None:
        if self.restore_generators:
            self._shadows.put_back()
        return super().__exit__(*exc)

    def _maps_dtype(self, func, args, kwargs) -> bool:
        if not self.draw_dtype:
            return False
        dtypes = {t.dtype for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        if "dtype" in kwargs and kwargs["dtype"] is not None:
            dtypes.add(kwargs["dtype"])
        elif not dtypes and any(a.name == "dtype" for a in func._schema.arguments):
            dtypes.add(torch.get_default_dtype())
        return any(d in self.draw_dtype for d in dtypes)

    def _on_cpu(self, func, args, kwargs, device: torch.device, generator):
        """The draw taken on the CPU (in the mapped dtype) and written back where the op would have put it."""
        wide: list[torch.dtype] = []

        def to_cpu(v):
            if isinstance(v, torch.Tensor):
                if v.dtype in self.draw_dtype:
                    wide.append(v.dtype)
                    return v.detach().to("cpu", self.draw_dtype[v.dtype])
                return v.detach().to("cpu")
            return v

        cpu_args, cpu_kwargs = tree_map(to_cpu, (args, kwargs))
        if "device" in cpu_kwargs and cpu_kwargs["device"] is not None:
            cpu_kwargs["device"] = torch.device("cpu")
        if any(a.name == "dtype" for a in func._schema.arguments):
            asked = cpu_kwargs.get("dtype") or (torch.get_default_dtype() if not wide else None)
            if asked in self.draw_dtype:
                wide.append(asked)
                cpu_kwargs["dtype"] = self.draw_dtype[asked]
        used = torch.default_generator
        device_generator = generator is not None and generator.device.type != "cpu"
        if device_generator:
            used, key = self._shadows.stand_in(generator)
            cpu_args, cpu_kwargs = _with_generator(func, cpu_args, cpu_kwargs, used)
        elif generator is not None:
            used = generator
        out = func(*cpu_args, **cpu_kwargs)
        if device_generator:
            self._shadows.drew(generator, used, key)
        back = wide[0] if wide else None

        def home(t):
            if not isinstance(t, torch.Tensor):
                return t
            dtype = back if back is not None and t.dtype == self.draw_dtype.get(back) else t.dtype
            return t.to(device, dtype)

        if func._schema.is_mutable:  # in place (normal_) or out=: the draw goes into the tensors the op writes
            for original, drawn in zip(tree_leaves((args, kwargs)), tree_leaves((cpu_args, cpu_kwargs))):
                if isinstance(original, torch.Tensor) and isinstance(drawn, torch.Tensor) and drawn is not original \
                        and original.shape == drawn.shape and _written(func, original, args, kwargs):
                    original.copy_(drawn)
            # A written tensor comes back as the caller's; a new result (rrelu_with_noise writes its noise and
            # returns its output) goes home like any draw's: left on the CPU, the target's backward failed.
            return tree_map(lambda v: _original_of(v, cpu_args, cpu_kwargs, args, kwargs, home), out), used
        return tree_map(home, out), used


@dataclass(frozen=True)
class StartState:
    """Where every side of a comparison starts: the CPU generator's state, and Python's and NumPy's global
    generators'. A model that picks its path with ``random.randint`` (PyTorch's dynamic_net example draws its
    depth so) must pick alike on every side, or two CPU runs differ and the layers go unjudged."""

    cpu: torch.Tensor  # torch's CPU generator
    host: tuple  # conformance.seeding.host_generator_state

    @classmethod
    def now(cls) -> "StartState":
        return cls(cpu=torch.random.get_rng_state(), host=host_generator_state())


@contextmanager
def same_draws(state: StartState, *, double: bool = False, source_files=()) -> Iterator[SharedDraws]:
    """One side of a comparison that must be deterministic: the generators at ``state`` (every side starts
    from the same one), every ATen draw taken from the CPU's (in float32 for a float64 side), inductor's random
    ops left to ATen (``fallback_random``, as dynamo's accuracy runner sets it), and the caller's generators as
    they were afterwards."""
    import torch._inductor.config as inductor_config

    caller = host_generator_state()
    with torch.random.fork_rng(devices=[]), inductor_config.patch(fallback_random=True):
        torch.random.set_rng_state(state.cpu)
        set_host_generator_state(state.host)
        try:
            with SharedDraws(shared=True, draw_dtype={torch.float64: torch.float32} if double else None,
                             source_files=source_files, restore_generators=True) as mode:
                yield mode
        finally:
            set_host_generator_state(caller)


def _written(func, tensor: torch.Tensor, args, kwargs) -> bool:
    """Whether the op writes ``tensor`` (its ``self`` in place, or an ``out=`` argument)."""
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
        if value is tensor:
            return True
    return False


def _original_of(value, cpu_args, cpu_kwargs, args, kwargs, home):
    """The caller's tensor behind a CPU stand-in returned by an in-place op; ``home(value)`` for a new one."""
    if not isinstance(value, torch.Tensor):
        return value
    for original, drawn in zip(tree_leaves((args, kwargs)), tree_leaves((cpu_args, cpu_kwargs))):
        if drawn is value:
            return original
    return home(value)


__all__ = ["Draw", "DrawLog", "Parting", "SharedDraws", "StartState", "StreamDifference", "compare_streams", "draws",
           "first_parting", "same_draws"]
