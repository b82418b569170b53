"""An unchanged training script's side: the script runs as ``__main__`` in a worker process of its own.

The script runs as ``python SCRIPT ARGS`` would run it, once per side, each
side in a fresh worker process of the runner's supervisor (validate/execute.py).
Nothing in the script is changed; this module makes the script see the
side's device and watches it:

* **device**: on the target, the emulated (or real) neuron device is
  registered, so ``torch.accelerator.current_accelerator()`` is ``neuron``.
  On a CPU reference the side's process starts with backend autoload off, and this
  module makes ``torch.accelerator`` report the CPU. A ``--device`` option the
  script declares is filled in with the side's device, and ``{device}`` in
  the script's arguments is replaced by it.
* **losses**: ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
  records every scalar loss and the time of the call; with ``--steps N`` the
  script is stopped at its N+1-th ``backward()``.
* **the model**: ``nn.Module.__call__`` notices the first call of a module
  with parameters that is not inside another module's call (the model). It
  keeps a copy of the model and of the inputs of that first call, and the
  gradient the script's loss sends into its output; after the script ends,
  :func:`diff.localize.localize` compares that call, module by module, against
  the CPU in this process. A script that trains several top-level modules
  (an embedding, an encoder and a head held apart; two towers of a contrastive
  model; a GAN's two networks) has each one's first call kept alike, until
  every optimizer has stepped, and all of them compared (:class:`ScriptModules`):
  a fault in the encoder is found where only the embedding was compared
  before. In compile mode each such module is compiled with the target's
  backend (``model.compile()``) before its first call; a ``torch.compile`` in
  the script itself gets the target's backend (on the eager CPU reference it
  becomes a no-op).
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch

from conformance.target import GraphCounter, TargetSpec

from .common import ChildSpec, SideObservations, localization_observations
from .named_device import script_device, torch_neuronx_stand_in
from .probes import compile_observations, error_info, fingerprint, named_inputs, placement_scan, wide_tensors
from .workdir import as_run_in_mirror


MAX_COMPARED_CALLS = 8  # top-level modules of the first step compared: bounds the copies kept and compared


@dataclass(slots=True)
class _Call:
    """A top-level module's first call of the first training step, kept for the comparison (target side)."""

    name: str  # the script's own name for the module (``enc``), else its class's
    module: Any  # a weak reference to the live module
    kind: str  # its class's name
    autocast: str | None = None  # the dtype of the autocast region it ran in, if any
    fingerprints: dict = field(default_factory=dict)
    snapshot: Any = None  # a copy of the module as called (None: not copied)
    inputs: Any = None  # (args, kwargs) on the CPU
    grad_output: list = field(default_factory=list)  # the first gradient reaching each floating output
    output_sizes: list = field(default_factory=list)


class ScriptModules(torch.nn.Module):
    """The top-level modules a script trained in its first step, each called with the inputs it had there: one
    model for the comparison, whose layers carry the script's own names for them (``enc.layers.0.linear1``).
    ``forward`` takes one ``(args, kwargs)`` per module and returns each module's output, in order."""

    def __init__(self, modules: dict[str, torch.nn.Module]) -> None:
        super().__init__()
        for name, module in modules.items():
            self.add_module(name, module)

    def forward(self, *calls):
        return tuple(module(*args, **kwargs) for module, (args, kwargs) in zip(self.children(), calls))


class StopScript(BaseException):
    """Raised at the backward() call after the last requested step (a BaseException: `except Exception` lets it pass)."""


class _State:
    def __init__(self, spec: ChildSpec, progress) -> None:
        self.spec = spec
        self.progress = progress
        self.losses: list[float] = []  # one per optimizer step (per backward() where no optimizer steps)
        self.times: list[float] = []
        self.micro_losses: list[float] = []  # one per backward(): gradient accumulation makes several a step
        self.backward_calls = 0  # of a scalar loss or not
        self.in_transforms: dict[str, None] = {}  # modules called inside torch.func transforms, by class
        self.micro_times: list[float] = []
        self.pending: list[float] = []  # backward() losses since the last optimizer step
        self.in_step = 0  # inside an optimizer's step(): a backward() there is its closure's (L-BFGS)
        self.closure_losses: list[float] = []  # backward() losses of the closure of the step under way
        self.closure_steps = 0  # steps whose backward() calls ran in the optimizer's closure
        self.optimizer_steps = 0
        self.optimizers: set[int] = set()  # those whose steps closed a training step (a GAN has two)
        self.optimizers_made = weakref.WeakSet()  # every optimizer the script made
        self.stepped: set[int] = set()  # those that have stepped
        self.script_compiles: list[str] = []  # where the script calls torch.compile itself
        self.model_compiled = False  # the compared call went through the script's own compile of the model
        self.harness_compiles = False
        self.first_call_time: float | None = None
        self.depth = 0
        self.captured = False  # a call that builds a graph was captured (others are, until the first step ends)
        self.frozen = False  # the first step is over (see _first_step_over): nothing more is captured
        self.calls: list[_Call] = []  # the captured calls, the first one first
        self.scanned: set[int] = set()  # modules whose placement was scanned
        self.copy_error = ""  # why the compared call's model could not be copied (its layers are not compared)
        self.root_scan: dict = {}
        self.wide: list = []
        self.recording = True
        self.notes: list[str] = []
        self.compiled_graphs = None  # a GraphCounter: the graphs compiled on this side
        self.counters: list = []
        # The model's call that is compared: the first that builds a graph for gradients; a first call
        # without gradients (eval under no_grad, as nanoGPT's estimate_loss) is kept only until one does.
        # Other top-level modules' first calls that build graphs in the first step are compared too.
        # Each graph dynamo hands a backend on this side, in order: its input shapes and dtypes, and whether
        # the model was in train() mode (a graph per mode is expected, not a recompilation).
        self.graphs_seen: list[dict] = []
        self.started = 0.0  # perf_counter when the script started
        self.stopped = False  # stopped at the last requested step (StopScript)

    def completed_steps(self) -> int:
        """Training steps so far: optimizer steps, or backward() calls in a script that steps no optimizer."""
        return self.optimizer_steps if self.optimizer_steps else len(self.micro_losses)

    def curve(self) -> tuple[list[float], list[float]]:
        """(losses, end times) per step: each optimizer step's is the mean of its backward() losses."""
        if self.optimizer_steps:
            return self.losses, self.times
        return self.micro_losses, self.micro_times

    @property
    def root_type(self) -> str:
        """The class of the model: the first captured call's module ("" before any call)."""
        return self.calls[0].kind if self.calls else ""

    @property
    def autocast(self) -> str | None:
        """The dtype of the autocast region the first captured call ran in, if any (the comparison's)."""
        return self.calls[0].autocast if self.calls else None

    def note_graph(self, gm, inputs: dict) -> None:
        root = self.calls[0].module() if self.calls else None
        self.graphs_seen.append({**inputs, "training": None if root is None else bool(root.training)})


def _script_args(spec: ChildSpec, device: str, device_option: str | None) -> list[str]:
    args = [a.replace("{device}", device) for a in spec.script_args]
    if device_option and not any(a == device_option or a.startswith(device_option + "=") for a in args):
        args += [device_option, device]
    return args


def _patch_accelerator_for_cpu(torch) -> None:
    """A CPU side (the reference, or a cpu / cpu:compile target): torch.accelerator says there is none and
    hands out the CPU, as one device (a torchrun-style ``LOCAL_RANK % device_count()`` then picks it on every
    rank). Without it a script asking for the accelerator gets the emulated neuron device on a CPU target."""
    cpu = torch.device("cpu")
    torch.accelerator.is_available = lambda: False
    torch.accelerator.current_accelerator = lambda check_available=False: None if check_available else cpu
    torch.accelerator.device_count = lambda: 1
    torch.accelerator.synchronize = lambda device=None: None
    # CUDA too, where the machine has it: ``"cuda" if torch.cuda.is_available() else "cpu"`` must pick the CPU
    # here, or the reference of a CUDA target runs on the GPU and is compared with itself.
    torch.cuda.is_available = lambda: False
    torch.cuda.device_count = lambda: 0
    # Pinned memory is the accelerator's host memory: with none, pinning is a copy. PyTorch asks for CUDA's
    # allocator on a machine without an accelerator, so ``x.pin_memory().to(device, non_blocking=True)``, which
    # runs on any device, failed here with "Found no NVIDIA driver".
    torch.Tensor.pin_memory = lambda self, device=None: self.clone()
    torch.Tensor.is_pinned = lambda self, device=None: False


def _install(state: _State, torch, here) -> dict:
    """Patches backward, Module.__call__ and torch.compile for this side's Target and hooks every optimizer's
    step; returns the originals for :func:`_uninstall`."""
    from torch.amp.grad_scaler import GradScaler

    originals = {"backward": torch.autograd.backward, "call": torch.nn.Module.__call__, "compile": torch.compile,
                 "scale": GradScaler.scale, "optimizer_init": torch.optim.Optimizer.__init__}
    torch.optim.Optimizer.__init__ = _noting_optimizer(state, originals["optimizer_init"])
    torch.autograd.backward = _recording_backward(state, torch, originals["backward"])
    GradScaler.scale = _marking_scale(originals["scale"])
    torch.nn.Module.__call__ = _capturing_call(state, torch, here, originals["call"])
    torch.compile = _counting_compile(state, torch, here, originals["compile"])
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    before_step, after_step = _step_recorder(state)
    originals["step_hooks"] = (register_optimizer_step_pre_hook(before_step),
                               register_optimizer_step_post_hook(after_step))
    originals["_exit"] = os._exit
    os._exit = _ending_exit(originals["_exit"])
    return originals


def _ending_exit(real_exit):
    """``os._exit`` that, called by the script itself (this process, its main thread), ends the script as
    ``sys.exit`` would: scripts call it after training to skip a slow teardown, and the side's process died
    before it reported, "the script's process died" (exit 2) for a script that had trained. Processes forked
    from this one (DataLoader workers, which end with ``os._exit``) and other threads exit for real."""
    import threading

    pid = os.getpid()

    def _exit(code):
        if os.getpid() == pid and threading.current_thread() is threading.main_thread():
            raise SystemExit(code)
        real_exit(code)

    return _exit


def _uninstall(torch, originals: dict) -> None:
    from torch.amp.grad_scaler import GradScaler

    GradScaler.scale = originals["scale"]
    torch.optim.Optimizer.__init__ = originals["optimizer_init"]
    torch.autograd.backward = originals["backward"]
    torch.nn.Module.__call__ = originals["call"]
    torch.compile = originals["compile"]
    os._exit = originals["_exit"]
    for hook in originals["step_hooks"]:
        hook.remove()


def _marking_scale(orig_scale):
    """GradScaler.scale that marks the scaled loss with the loss it scaled: the curve records the loss, not the
    loss times a scale that grows and backs off on its own schedule (65,536 at first). A step the target's
    scaler skips for an inf gradient halves its scale: recorded scaled, its curve would lie 2x off the
    reference's from then on, where the losses themselves agree."""
    import torch

    def scale(self, outputs):
        scaled = orig_scale(self, outputs)
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1 and scaled is not outputs:
            scaled._unscaled_loss = outputs
        return scaled
    return scale


def _recording_backward(state: _State, torch, orig_backward):
    """backward() that records each scalar loss (and stops the script after the last requested step)."""
    spec = state.spec

    def backward(tensors, grad_tensors=None, *args, **kwargs):
        if state.recording:
            state.backward_calls += 1
            _first_step_over(state)
            t = tensors if isinstance(tensors, torch.Tensor) else (
                tensors[0] if isinstance(tensors, (list, tuple)) and len(tensors) == 1 else None)
            if isinstance(t, torch.Tensor) and t.numel() == 1:
                if spec.steps is not None and state.completed_steps() >= spec.steps:
                    raise StopScript()
                value = float(getattr(t, "_unscaled_loss", t).detach().float().cpu())
                state.micro_losses.append(value)
                state.micro_times.append(time.perf_counter())
                state.pending.append(value)
                if state.in_step:
                    state.closure_losses.append(value)
                if not state.optimizer_steps:
                    state.progress(side=spec.side, phase="train", step=len(state.micro_losses), steps=spec.steps,
                                   loss=value)
        return orig_backward(tensors, grad_tensors, *args, **kwargs)
    return backward


def _noting_optimizer(state: _State, orig_init):
    """Optimizer.__init__ that notes each optimizer the script makes (see :func:`_first_step_over`)."""
    import functools

    @functools.wraps(orig_init)
    def init(self, *args, **kwargs):
        orig_init(self, *args, **kwargs)
        state.optimizers_made.add(self)
    return init


def _first_step_over(state: _State) -> None:
    """Ends the capture of the first step's top-level calls once every optimizer the script made has stepped
    (at the second backward() of a script that makes none). A GAN's generator is called between the
    discriminator's two backward() calls (dcgan) or only after several critic steps, under ``no_grad`` until
    then (WGAN): it is captured with the discriminator, where stopping at the first backward() or the first
    step left it out (a 1% tanh fault in the generator was READY)."""
    if not state.captured:
        return
    made = list(state.optimizers_made)
    if made:
        state.frozen = all(id(optimizer) in state.stepped for optimizer in made)
    else:
        state.frozen = state.backward_calls >= 2


def _step_recorder(state: _State):
    """Global pre- and post-hooks of every optimizer's step(): the post-hook closes a training step (gradient
    accumulation gives it several backward() calls; a GradScaler that skips a step leaves them to the next).

    An optimizer that evaluates a closure (L-BFGS: its line search calls it a number of times that depends on
    the values) runs backward() inside step(): that step's loss is the closure's first, at the step's starting
    weights, as ``step(closure)`` returns it. The mean of the line search's trial points moved 25% between
    perturbed runs of a small regression, so the curves could not tell a correct device from a wrong one."""
    def before_step(optimizer, args, kwargs) -> None:
        state.in_step += 1
        if state.in_step == 1:
            state.closure_losses = []

    def optimizer_step(optimizer, args, kwargs) -> None:
        state.in_step = max(0, state.in_step - 1)
        if state.recording:
            state.stepped.add(id(optimizer))
            _first_step_over(state)
        if not state.recording or not state.pending:
            return
        state.optimizers.add(id(optimizer))
        state.optimizer_steps += 1
        value = sum(state.pending) / len(state.pending)
        if state.closure_losses and not state.in_step:
            value = state.closure_losses[0]
            state.closure_steps += 1
            state.closure_losses = []
        state.losses.append(value)
        state.times.append(time.perf_counter())
        state.pending = []
        state.progress(side=state.spec.side, phase="train", step=state.optimizer_steps, steps=state.spec.steps,
                       loss=value)
    return before_step, optimizer_step


# Modules PyTorch calls on a model's behalf, never the model: a parametrized layer's weight is computed by
# calling its ParametrizationList (which holds the parameter ``original``) whenever it is read, first while
# ``spectral_norm`` registers it on the CPU, before the script moves the model: that call was taken for the
# model ("3 parameters or buffers left on the CPU: original, 0._u, 0._v", its gradients never compared).
_PYTORCH_MACHINERY = ("torch.nn.utils.parametrize", "torch.nn.utils.parametrizations")


def _capturing_call(state: _State, torch, here, orig_call):
    """Module.__call__ that captures the compared calls (see _State), compiles them under a compile target, and
    on the target keeps the gradient that reaches their outputs."""
    def call(self, *args, **kwargs):
        # Dynamo traces this wrapper inside a compiled model and guards on each value it reads here: it reads
        # nothing of the state there (a guard on the depth recompiled every model the harness compiles, and one
        # on ``frozen`` recompiled it when the first step ended).
        if torch.compiler.is_compiling() or state.frozen or state.depth or not state.recording:
            return orig_call(self, *args, **kwargs)
        if torch._C._functorch.peek_interpreter_stack() is not None:
            # Inside a torch.func transform (vmap, grad, jacrev) the inputs and the swapped-in parameters are
            # functorch's wrappers, which have no storage to copy; a call outside one is captured instead.
            if not any(True for _ in self.parameters()):
                return orig_call(self, *args, **kwargs)
            state.in_transforms.setdefault(type(self).__name__, None)  # named if nothing else is compared
            return _inside(state, orig_call, self, args, kwargs)
        if not any(True for _ in self.parameters()) or type(self).__module__ in _PYTORCH_MACHINERY:
            return orig_call(self, *args, **kwargs)
        builds_graph = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        # torch.compile(model) hands back a wrapper (_orig_mod); model.compile() compiles in place
        model = getattr(self, "_orig_mod", self)
        if isinstance(model, torch.nn.DataParallel):
            # On one device it calls its module with the same inputs; copied to the CPU reference it refuses
            # to run ("module must have its parameters and buffers on device neuron:0 (device_ids[0])").
            model = model.module

        def capture() -> _Call:
            compiled = hasattr(self, "_orig_mod") or getattr(self, "_compiled_call_impl", None) is not None
            state.model_compiled = state.model_compiled or compiled
            return _capture(state, torch, model, args, kwargs, here, name=_script_name(self, model, state))

        if not builds_graph:
            if not state.root_type:  # the first call: kept until a call with gradients replaces it
                capture()
            return _inside(state, orig_call, self, args, kwargs)
        if state.captured and (len(state.calls) >= MAX_COMPARED_CALLS
                               or any(c.module() is model for c in state.calls)):
            return _inside(state, orig_call, self, args, kwargs)  # compared already, or enough compared
        if not state.captured:  # only a call that builds a graph is captured for good
            state.calls.clear()
            state.model_compiled = False
            state.captured = True
        entry = capture()
        if here.compiles and not hasattr(self, "_orig_mod"):
            state.harness_compiles = True  # the harness's compile, not the script's
            try:
                self.compile(backend=state.compiled_graphs, dynamic=False)
            finally:
                state.harness_compiles = False
        out = _inside(state, orig_call, self, args, kwargs)
        if state.spec.side == "target":
            _keep_output_gradients(entry, out)
        return out
    return call


def _inside(state: _State, orig_call, module, args, kwargs):
    """A top-level module's call, during which its submodules' calls are not taken for top-level ones."""
    state.depth += 1
    try:
        return orig_call(module, *args, **kwargs)
    finally:
        state.depth -= 1


def _script_name(called, model, state: _State) -> str:
    """The script's own name for a module it calls (``enc`` for ``enc(x)``, ``model`` for ``self.model(x)``,
    ``head`` for ``model.head(x)``), from the calling frame's variables and their modules' children, or its
    class's; unique among the captured calls."""
    frame = _script_frame(3)
    name = ""
    if frame is not None:
        scopes = [frame.f_locals]
        owner = frame.f_locals.get("self")
        if owner is not None:
            scopes += [getattr(owner, "__dict__", {}), getattr(owner, "_modules", None) or {}]
        scopes.append(frame.f_globals)
        named = [(key, value) for scope in scopes for key, value in list(scope.items())
                 if key.isidentifier() and key != "self"]
        name = next((key for key, value in named if value is called or value is model), "")
        name = name or next((child for _, value in named if isinstance(value, torch.nn.Module)
                             for child, sub in value._modules.items() if sub is called or sub is model), "")
    name = name or type(model).__name__.lower()
    if hasattr(torch.nn.Module, name):  # a variable named ``train`` or ``forward``: not a submodule's name
        name += "_"
    taken = {c.name for c in state.calls}
    unique, k = name, 2
    while unique in taken:
        unique, k = f"{name}_{k}", k + 1
    return unique


def _keep_output_gradients(entry: _Call, out) -> None:
    """Hooks a compared call's floating outputs so the first gradient reaching each is kept (on the CPU): the
    localisation's backward pass starts from it."""
    from diff.sides import float_leaves, to_device

    leaves = float_leaves(out)
    entry.grad_output = [None] * len(leaves)
    entry.output_sizes = [t.numel() for t in leaves]

    def hook_for(j):
        def hook(grad):
            if entry.grad_output[j] is None:
                entry.grad_output[j] = to_device(grad, "cpu", requires_grad=False)
        return hook

    for j, leaf in enumerate(leaves):
        if leaf.requires_grad:
            leaf.register_hook(hook_for(j))


def _counting_compile(state: _State, torch, here, orig_compile):
    """torch.compile that notes where the script compiles, is a no-op on an eager reference, and counts every
    graph on the target, whichever backend the script names, and once: the harness's own compile
    (Module.compile calls torch.compile) already passes its counter."""
    def compile_(model=None, *args, **kwargs):
        if not state.harness_compiles:
            state.script_compiles.append(_caller_outside_torch())
        if state.spec.side != "target" and not here.compiles:
            if model is None:
                return lambda m: m
            return model
        if isinstance(kwargs.get("backend"), GraphCounter):
            pass
        elif "backend" in kwargs:
            kwargs["backend"] = GraphCounter(kwargs["backend"], on_graph=state.note_graph)
            state.counters.append(kwargs["backend"])
        else:
            kwargs["backend"] = state.compiled_graphs
        return orig_compile(model, *args, **kwargs) if model is not None else orig_compile(*args, **kwargs)
    return compile_


def _capture(state: _State, torch, root, args, kwargs, target, *, name: str) -> _Call:
    """At a compared call: a copy of the module, its inputs, and what the target will do with them.

    A first call without gradients is kept until a call that builds a graph replaces it, so that both sides
    always describe the same calls.
    """
    from diff.sides import model_copy, to_device

    if state.first_call_time is None:
        state.first_call_time = time.perf_counter()
    entry = _Call(name=name, module=weakref.ref(root), kind=type(root).__name__)
    sketches: dict[str, list] = {"parameters_sketch": [], "inputs_sketch": []}
    entry.fingerprints = {"parameters": fingerprint(root.state_dict().values(), sketches["parameters_sketch"]),
                          "inputs": fingerprint((t for _, t in named_inputs(args, kwargs)), sketches["inputs_sketch"]),
                          **sketches}
    device_type = target.device.type if state.spec.side == "target" else "cpu"
    entry.autocast = (str(torch.get_autocast_dtype(device_type)).removeprefix("torch.")
                      if torch.is_autocast_enabled(device_type) else None)
    state.calls.append(entry)
    if state.spec.side != "target":
        return entry
    if id(root) not in state.scanned:
        state.scanned.add(id(root))
        prefix = "" if len(state.calls) == 1 else f"{name}."
        scan = placement_scan(root, target.device.type)
        for key, found in scan.items():
            merged = state.root_scan.setdefault(key, [])
            merged += [{**item, "name": prefix + item["name"]} if "name" in item else item for item in found]
        state.wide += [{**item, "name": prefix + item["name"]} for item in
                       wide_tensors([*named_inputs(args, kwargs), *root.named_parameters(), *root.named_buffers()])]
    if not state.spec.localize:
        return entry
    try:
        entry.snapshot = model_copy(root)
        entry.inputs = to_device((tuple(args), dict(kwargs)), "cpu", requires_grad=False)
    except Exception as exc:  # noqa: BLE001 - a model that cannot be copied is still validated, without layers
        state.copy_error = f"the model cannot be copied ({type(exc).__name__}: {exc})"
    return entry


def _joint_fingerprints(calls: list[_Call]) -> dict:
    """The fingerprints of the calls captured (validate.checks compares them between the sides): the weights
    of every module, the inputs of the first alone. A later module's inputs are computed on the side's device
    (the encoder's output the head takes), so they differ wherever the device rounds otherwise."""
    if len(calls) == 1:
        return calls[0].fingerprints
    import hashlib

    first = calls[0].fingerprints
    return {"parameters": hashlib.sha1("|".join(c.fingerprints["parameters"] for c in calls).encode()).hexdigest()[:16],
            "parameters_sketch": [s for c in calls for s in c.fingerprints["parameters_sketch"]],
            "inputs": first["inputs"], "inputs_sketch": first["inputs_sketch"]}


@dataclass(slots=True)
class _ComparedCall:
    """The one model call the comparison runs on both sides (see :func:`_compared`)."""

    model: Any
    args: tuple
    kwargs: dict
    grad: list | None  # the gradient its backward pass starts from (None: the forward pass alone)


def _compared(state: _State) -> _ComparedCall | None:
    """The captured calls as the one model call the comparison runs: the call itself where one was captured,
    else :class:`ScriptModules` of every call that was copied and ran under the first one's autocast; None
    where none was copied."""
    usable = [c for c in state.calls if c.snapshot is not None and c.autocast == state.autocast]
    left = [c.name for c in state.calls if c not in usable]
    if left and usable:
        state.notes.append(f"not compared layer by layer: {', '.join(left)} (not copied, or under another "
                           "autocast than the first module's)")
    if not usable:
        return None
    state.copy_error = ""
    grads = [_upstream_gradient(c.grad_output, c.output_sizes) or [None] * len(c.output_sizes) for c in usable]
    grad = [g for per_call in grads for g in per_call]
    grad = grad if any(g is not None for g in grad) else None
    if len(usable) == 1:
        (args, kwargs), model = usable[0].inputs, usable[0].snapshot
        return _ComparedCall(model=model, args=args, kwargs=kwargs, grad=grad)
    model = ScriptModules({c.name: c.snapshot for c in usable})
    return _ComparedCall(model=model, args=tuple(c.inputs for c in usable), kwargs={}, grad=grad)


@contextlib.contextmanager
def _autocast(dtype_name: str | None, device_types: tuple[str, ...]):
    """The script's autocast region, on every side's device at once, for the comparison of the call that ran
    in it: the layers, the drill into ops and the compiled check alike. Autocast leaves float64 alone, so
    the golden run keeps its full precision."""
    if dtype_name is None:
        yield
        return
    import torch

    with contextlib.ExitStack() as stack:
        for device_type in dict.fromkeys(device_types):
            stack.enter_context(torch.autocast(device_type=device_type, dtype=getattr(torch, dtype_name)))
        yield


def _why_no_gradients(state: _State) -> str | None:
    """Why the compared call's gradients cannot be compared, in the user's terms (None: they can)."""
    if not state.captured and state.root_type:
        return ("the model was only called without gradients (eval under torch.no_grad or inference_mode); "
                "its outputs are compared, its gradients cannot be")
    if state.captured and not any(g is not None for c in state.calls for g in c.grad_output):
        if not state.backward_calls:  # ensembling or inference: nothing to differentiate, and nothing wrong
            return "the script calls no backward(), so there are no gradients to compare"
        return ("no gradient reached the model's output from the script's backward() (the script stopped "
                "before it, or the loss does not depend on this call's output)")
    return None


def observe(spec: ChildSpec, progress) -> dict:
    """Runs the script on this side and returns what was seen (``script_problem`` when the side cannot run)."""
    import torch

    from conformance.target import TargetError, resolve_target

    from .script import inspect_script

    device_option = inspect_script(spec.script).device_option
    result: dict = {"convention": "training", "notes": []}
    try:
        # The reference side never resolves the target: that would register the neuron device here.
        if spec.side == "target":
            here = resolve_target(spec.target, backend_modules=spec.backend_modules)
        else:
            here = resolve_target(spec.reference)
    except TargetError as exc:
        result["script_problem"] = str(exc)
        return result
    if here.kind == "cpu":
        _patch_accelerator_for_cpu(torch)
    if spec.device_alias and spec.device_alias != here.device.type:
        result["notes"].append(f"the script names the {spec.device_alias} device itself: on the {spec.side} side "
                               f"that name meant {here.device.type}")
    result["manifest"] = here.manifest()
    state = _State(spec, progress)
    side = SideObservations()
    trace, draws = _run_script(spec, here, state, side, device_option, progress)
    _side_observations(here, state, side, draws)
    if spec.side == "target":
        _target_observations(here, state, side, trace, draws, result)
        compared = _compared(state)
        if compared is not None:
            _compare_snapshot(spec, here, state, compared, side, result, progress)
        elif state.copy_error:  # a warning, never silence: the verdict would rest on the curves alone
            result["localization_error"] = state.copy_error
    result["side"] = spec.side
    result[spec.side] = side.to_dict()
    result["notes"] += state.notes
    return result


def run_as_main(path: str, file: str) -> None:
    """``path`` run as ``__main__``, as ``runpy.run_path`` runs it, with ``__file__`` naming ``file`` (its copy in
    the side's mirror). Its code keeps ``path`` as its file name, so tracebacks, the lines findings name and
    the user's files the comparison prefers are yours."""
    if file == path:
        runpy.run_path(path, run_name="__main__")
        return
    import builtins
    import types

    with open(path, "rb") as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=file, __cached__=None, __loader__=None, __package__="", __spec__=None,
                         __builtins__=builtins)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is None:
            sys.modules.pop("__main__", None)
        else:
            sys.modules["__main__"] = saved


def _run_script(spec: ChildSpec, here, state: _State, side: SideObservations, device_option: str | None, progress):
    """Runs the script as ``__main__`` with the recording hooks installed (and removed after), perturbed and
    drawing the reference's numbers where the spec asks; the script's failure is ``side.error``. Returns the
    op trace and the draws."""
    import torch

    as_run = as_run_in_mirror(spec.script) or spec.script  # the script's __file__: see validate.workdir
    sys.argv = [as_run, *_script_args(spec, str(here.device), device_option)]
    sys.path.insert(0, os.path.dirname(spec.script))
    if here.compiles and here.is_emulated:
        from emulator import compile_backend

        compile_backend.clear_compile_events()  # its narrowing losses: this run's only
    state.compiled_graphs = GraphCounter(here.compile_backend(), on_graph=state.note_graph)
    state.counters.append(state.compiled_graphs)
    originals = _install(state, torch, here)
    state.started = time.perf_counter()
    progress(side=spec.side, phase="run")
    here.peak_memory(reset=True)
    perturb = contextlib.nullcontext()
    if spec.perturb_seed is not None and spec.precision:
        from diff.precision import PerturbMode, PrecisionModel

        perturb = PerturbMode(model=PrecisionModel.from_dict(spec.precision), seed=spec.perturb_seed)
    draws = _draws_for(spec, here)
    _seed_generators(spec.seed + int(os.environ.get("RANK", "0") or 0))
    _platform_start_method()
    named = script_device(torch, spec.device_alias, here.device)
    stand_in = torch_neuronx_stand_in(torch, TargetSpec.parse(spec.target).device, on_target=here.kind != "cpu")
    with here.track_ops() as tracker, perturb, draws, named, stand_in:
        try:
            run_as_main(spec.script, as_run)
        except StopScript:
            state.stopped = True
        except SystemExit as exc:
            if exc.code not in (None, 0):
                side.error = {"type": "SystemExit", "message": f"the script exited with status {exc.code}",
                              "source": None, "phase": _phase(state), "import_error": False}
        except BaseException as exc:  # noqa: BLE001 - the script's failure is a result
            side.error = error_info(exc, files=[spec.script], phase=_phase(state))
        finally:
            state.recording = False
            _uninstall(torch, originals)
    side.seconds = time.perf_counter() - state.started
    return tracker.trace, draws


def _platform_start_method() -> None:
    """multiprocessing's default start method back to the platform's, as under ``python SCRIPT``.

    This process descends from one started with ``spawn``, which makes ``spawn`` the default for good
    (multiprocessing.spawn.prepare). A script's DataLoader workers were then spawned: each ran the script's
    top level again (a script without a ``__main__`` guard failed on both sides: "DataLoader worker exited
    unexpectedly"; pytorch/examples' MNIST took 15 s on the target instead of 3 s)."""
    import multiprocessing

    multiprocessing.set_start_method(None, force=True)


def _seed_generators(seed: int) -> None:
    """Python's, NumPy's and torch's global generators start alike on every side (the same rank of each side).

    A new interpreter seeds all three from the OS (torch 2.14 too: ``torch.initial_seed()`` differs from one
    ``import torch`` to the next), so a script that does not seed them (imagenet's ``--seed`` defaults to
    None; DCGAN draws its torch seed from ``random.randint(1, 10000)``; a ``random.shuffle`` of its file list,
    NumPy augmentation) would start each side from other weights and other batches: a comparison of
    different computations. A script that seeds them itself overrides this, as it would anyway. The sides'
    random draws on the device are the reference's or compared as a distribution (diff/draws.py): the same
    seed hides nothing of the backend's."""
    import torch

    from conformance.seeding import seed_host_generators

    seed_host_generators(seed)
    torch.manual_seed(seed)


def _side_observations(here, state: _State, side: SideObservations, draws) -> None:
    """What either side records: whether it ran, its loss curve and step times, its steps, compiles, draws."""
    from diff.curves import LossCurve

    side.ran = side.error is None
    side.fingerprints = _joint_fingerprints(state.calls) if state.calls else {}
    losses, times = state.curve()
    if losses:
        stamps = [state.first_call_time or state.started, *times]
        steps = [b - a for a, b in zip(stamps, stamps[1:])]
        side.curve = LossCurve(label=here.describe(), losses=tuple(losses), step_seconds=tuple(steps)).to_dict()
    side.extra["stopped_at_steps"] = state.stopped
    side.extra["steps"] = {"optimizer": state.optimizer_steps, "backward": len(state.micro_losses),
                           "optimizers": len(state.optimizers), "closure": state.closure_steps}
    side.extra["script_compiles"] = list(dict.fromkeys(state.script_compiles))
    side.extra["draws"] = draws.log.to_dict()
    side.extra["model"] = {"class": state.root_type} if state.root_type else None
    if len(state.calls) > 1:
        side.extra["model"]["modules"] = {c.name: c.kind for c in state.calls}
    side.extra["called_in_transforms"] = list(state.in_transforms)


def _target_observations(here, state: _State, side: SideObservations, trace, draws, result: dict) -> None:
    """What only the target records: its precision model and random stream, host fallbacks, device memory,
    placement, 64-bit tensors, graphs, and why gradients were not compared."""
    from diff.precision import model_for

    result["precision_model"] = model_for(here).to_dict()
    result["own_random_stream"] = here.own_random_stream is not None
    side.extra["fallback_ops"] = list(trace.fallback) if trace else []
    side.extra["executed_ops"] = len(trace.executed) if trace else None
    side.extra["random_ops"] = list(dict.fromkeys(draws.log.draws[i].op for i in draws.log.on_device))
    side.extra["device_memory_peak"] = here.peak_memory()  # evidence of use where ops are not tracked
    side.extra["accelerate"] = _accelerate_state()
    side.extra["placement"] = state.root_scan or {"cpu_state": [], "plain_tensors": []}
    side.extra["wide_tensors"] = state.wide
    if here.compiles or state.script_compiles:
        side.extra["compile"] = {**compile_observations(state.graphs_seen, emulated=here.is_emulated),
                                 "graphs": sum(c.graphs for c in state.counters)}
    why = _why_no_gradients(state)
    if why:
        result["gradients_not_compared"] = why
    if state.autocast:
        result["notes"].append(f"the compared call ran under autocast ({state.autocast}); the layer "
                               "comparison runs it so on both sides")


def _compare_snapshot(spec: ChildSpec, here, state: _State, compared: _ComparedCall, side: SideObservations,
                      result: dict, progress) -> None:
    """The compared call, localised layer by layer against the CPU, then in eval mode (functions.eval_mode_check)
    and, under a compile target, its compiled outputs and gradients against the eager reference; all three in
    the script's autocast region, on both sides."""
    from conformance.target import resolve_target

    from .functions import compiled_check, eval_mode_check

    model, args, kwargs, grad = compared.model, compared.args, compared.kwargs, compared.grad
    reference = resolve_target("cpu")
    with _autocast(state.autocast, ("cpu", here.device.type)):
        progress(side="target", phase="localize")
        try:
            result.update(localization_observations(model, args, kwargs, target=here, reference=reference,
                                                    grad_output=grad, files=[spec.script]))
        except Exception as exc:  # noqa: BLE001 - localisation is evidence, never a reason to lose the run
            result["localization_error"] = error_info(exc, files=[spec.script])["message"]
        if (result.get("localization") or {}).get("ok"):
            progress(side="target", phase="eval mode")
            result.update(eval_mode_check(model, args, kwargs, target=here, reference=reference, files=[spec.script]))
        if (here.compiles or state.model_compiled) and side.error is None:
            # The compiled model's outputs (and gradients) against the eager reference, as in the
            # functions convention: a compiler bug is a numerics finding, not a loss-curve wobble. Also where
            # the script compiles its model itself and the target runs eagerly: the target trained it compiled
            # (with its own backend), and a compile-only fault 1% off in every matmul moved nanoGPT's loss by
            # 0.01% in 10 steps, within the curves' band.
            progress(side="target", phase="compile")
            result["compiled"] = compiled_check(model, args, kwargs, target=here.in_mode("compile"),
                                                reference=reference, grad_output=grad, files=[spec.script])


def _script_frame(depth: int):
    """The innermost frame from ``depth`` frames above the caller on that is neither torch's nor this module's:
    the script's own (Module.compile calls torch.compile for it; Module.__call__ calls the harness's hooks)."""
    skipped = (os.path.dirname(torch.__file__), __file__)
    frame = sys._getframe(depth + 1)
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
    return frame


def _caller_outside_torch() -> str:
    """file:line of the innermost caller outside torch (Module.compile calls torch.compile for the script)."""
    frame = _script_frame(2)
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}" if frame is not None else "?"


def _accelerate_state() -> dict | None:
    """Hugging Face accelerate's version and the device it chose, where the script used it (Trainer does)."""
    accelerate = sys.modules.get("accelerate")
    if accelerate is None:
        return None
    try:
        from accelerate.state import PartialState

        device = str(PartialState().device) if PartialState._shared_state else ""
    except Exception:  # noqa: BLE001 - a version without that API: the version alone still helps
        device = ""
    return {"version": getattr(accelerate, "__version__", ""), "device": device}


def _draws_for(spec: ChildSpec, here):
    """The side's random draws (diff.draws): the target takes the reference's numbers unless it runs on its own
    stream; a "stream-K" reference side takes the draws the target made on the device from a generator of its
    own; every side logs its draws."""
    from diff.draws import SharedDraws

    shared = spec.side == "target" and spec.draws == "shared"
    if shared and here.compiles:  # inductor's own random kernels would draw other numbers: leave them to ATen
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    return SharedDraws(shared=shared, own_stream=spec.own_stream, seed=spec.perturb_seed or 0,
                       source_files=[spec.script])


def _upstream_gradient(grads: list, sizes: list[int]) -> list | None:
    """The gradients to start the localisation's backward pass from.

    When the model returns its own loss next to other outputs (Hugging Face ``output.loss``), the
    script's ``loss.backward()`` sent 1 into the loss and the logits' gradient came from it: starting
    from both would count the logits twice, so only the scalar outputs are kept then.
    """
    if not any(g is not None for g in grads):
        return None
    scalars = [i for i, (g, n) in enumerate(zip(grads, sizes)) if g is not None and n == 1]
    if scalars and len(scalars) < len(grads):
        return [g if i in scalars else None for i, g in enumerate(grads)]
    return grads


def _phase(state: _State) -> str:
    if not state.root_type:
        return "before the model's first call"
    if not state.losses:
        return "first step"
    return f"step {len(state.losses) + 1}"

