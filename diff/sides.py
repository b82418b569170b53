"""Running one side: moving values to a device, and running a model there.

Every comparison runs the same computation on two or three sides: the
target, the CPU reference, and a float64 golden on the CPU. What a side does
is always the same, so it is written once:

- :func:`to_device`: fresh copies of every tensor in a nested value, on a
  device, optionally in another floating dtype or with the very same strides
  and storage offset (a kernel may take another path for another layout);
- :func:`run_model`: a copy of a model on a device (and dtype), its forward
  pass, loss and backward, K optimizer steps, its outputs, losses,
  gradients and parameters; errors captured with the phase they happened in.

Op cases, model cases, the localiser, loss curves and ``neuron-validate``
all use these, so "the same inputs on every side" means the same thing
everywhere.
"""

from __future__ import annotations

import copy
import time
import types
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Mapping

import torch
from torch.nn.utils.rnn import PackedSequence
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

DtypeMap = Mapping[torch.dtype, torch.dtype]


def same_layout_copy(t: torch.Tensor, device) -> torch.Tensor:
    """A copy on ``device`` with the same sizes, strides and storage offset.

    Kernels may take another code path for another layout (vectorised or
    not), and with extreme values that changes results, so the target must
    see the very layout the reference saw: non-contiguous, transposed,
    expanded or channels-last.
    """
    if t.layout != torch.strided:
        return t.to(device)
    if t.is_conj():
        return same_layout_copy(t.conj(), device).conj()
    if t.is_neg():
        return same_layout_copy(t._neg_view(), device)._neg_view()
    numel = t.untyped_storage().nbytes() // t.element_size()
    if numel == 0:
        return t.to(device)
    whole = torch.as_strided(t, (numel,), (1,), 0).to(device, copy=True)
    return whole.as_strided(t.size(), t.stride(), t.storage_offset())


def names_device_type(value, from_type: str) -> bool:
    """Whether ``value`` is a device argument of type ``from_type`` (``torch.device`` or a string such as
    "cpu")."""
    if isinstance(value, torch.device):
        return value.type == from_type
    if isinstance(value, str) and value.split(":")[0] == from_type:
        try:
            return torch.device(value).type == from_type
        except RuntimeError:
            return False
    return False


_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.device, torch.dtype, torch.memory_format,
          torch.layout, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type, types.ModuleType)
_WALK_LIMIT = 10_000  # objects visited looking for tensors inside a value no pytree knows


def _tensors_within(value: Any, depth: int = 6) -> list[torch.Tensor] | None:
    """The tensors an object holds in its attributes, lists, tuples and dicts (a Hugging Face cache's keys and
    values), or None where there are none, the object is a module, or the walk passes ``_WALK_LIMIT``."""
    found: list[torch.Tensor] = []
    seen: set[int] = set()
    stack = [(value, depth)]
    while stack:
        obj, left = stack.pop()
        if id(obj) in seen or isinstance(obj, _PLAIN):
            continue
        if isinstance(obj, torch.nn.Module) or len(seen) >= _WALK_LIMIT:
            return None  # a model handed in as an argument is the caller's to copy, not a value
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
        elif left > 0:
            if isinstance(obj, dict):
                children = list(obj.values())
            elif isinstance(obj, (list, tuple, set, frozenset)):
                children = list(obj)
            else:
                children = list(getattr(obj, "__dict__", {}).values())
                children += [getattr(obj, n) for n in getattr(type(obj), "__slots__", ()) if hasattr(obj, n)]
            stack.extend((child, left - 1) for child in children)
    return found or None


def _copy_holding(value: Any, move: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """A copy of an object no pytree knows that holds tensors (transformers' ``DynamicCache``, handed to a
    model as ``past_key_values``), its tensors moved by ``move``; any other value as it is. Kept as it was,
    the object is shared with the script, which goes on filling it (the compared call's cache held the whole
    generation by the time it was replayed), and its tensors stay on the device they were made on (the
    reference's attention met keys and values on the target's device)."""
    if isinstance(value, _PLAIN):
        return value
    tensors = _tensors_within(value)
    if not tensors:
        return value
    memo = {id(t): move(t) for t in tensors}
    try:
        return copy.deepcopy(value, memo)
    except Exception:  # noqa: BLE001 - what cannot be copied is passed on as before
        return value


def to_device(value: Any, device=None, dtype: torch.dtype | DtypeMap | None = None, *, same_layout: bool = False,
              requires_grad: bool | None = None, redirect: str | None = None) -> Any:
    """Fresh, detached copies of the tensors in a nested value, on ``device`` (None: each tensor's own).

    ``dtype``: floating (and complex) tensors are cast to it; a mapping casts
    only the dtypes it names (float32 -> float64 for a golden run).
    ``same_layout``: keep strides and storage offset where the dtype is kept.
    ``requires_grad``: None keeps each floating tensor's flag.
    ``redirect``: device arguments of this type (``x.to("cpu")`` in a sample
    made on the CPU) are redirected to ``device``.
    """
    target = None if device is None else torch.device(device)

    def cast_to(t: torch.Tensor) -> torch.dtype:
        if dtype is None or not (t.is_floating_point() or t.is_complex()):
            return t.dtype
        if isinstance(dtype, torch.dtype):
            return dtype if t.is_floating_point() else t.dtype
        return dtype.get(t.dtype, t.dtype)

    def move(v):
        if redirect is not None and target is not None and names_device_type(v, redirect):
            return target if isinstance(v, torch.device) else str(target)
        if not isinstance(v, torch.Tensor):
            return _copy_holding(v, move)
        flag = v.requires_grad if requires_grad is None else requires_grad
        where = v.device if target is None else target
        want = cast_to(v)
        v = v.detach()
        out = same_layout_copy(v, where) if want == v.dtype and same_layout else v.to(device=where, dtype=want, copy=True)
        if out.is_floating_point() or out.is_complex():
            out.requires_grad_(flag)
        return out

    def move_packed(packed: PackedSequence) -> PackedSequence:
        # A PackedSequence's batch_sizes stay on the CPU on every device (PyTorch refuses them elsewhere: an
        # RNN called with packed sequences was "layers not compared: batch_sizes should always be on CPU").
        return packed._replace(data=move(packed.data), batch_sizes=packed.batch_sizes.clone(),
                               sorted_indices=tree_map(move, packed.sorted_indices),
                               unsorted_indices=tree_map(move, packed.unsorted_indices))

    return tree_map(lambda v: move_packed(v) if isinstance(v, PackedSequence) else move(v), value,
                    is_leaf=lambda v: isinstance(v, PackedSequence))


class _DeviceRedirect(TorchFunctionMode):
    """Device arguments of one device type, in any torch call, name another device instead; so does the tensor
    method of that type's name (``x.cuda()``)."""

    def __init__(self, from_type: str, to: torch.device) -> None:
        super().__init__()
        self.from_type, self.to = from_type, to

    def _swap(self, value):
        if names_device_type(value, self.from_type):
            return self.to if isinstance(value, torch.device) else str(self.to)
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if args and isinstance(args[0], torch.Tensor) and getattr(func, "__name__", "") == self.from_type:
            return args[0].to(self.to, non_blocking=bool(kwargs.get("non_blocking", False)))  # x.cuda(0)
        if type(kwargs.get("device")) is int:  # a device index names the script's accelerator: its device type
            kwargs = {**kwargs, "device": self.to}
        if func is torch.Tensor.to and len(args) > 1 and type(args[1]) is int:  # x.to(local_rank)
            args = (args[0], self.to, *args[2:])
        return func(*(self._swap(a) for a in args), **{k: self._swap(v) for k, v in kwargs.items()})


def device_named_as(device, named: str | None) -> ContextManager:
    """While a side runs on ``device``, device arguments of type ``named`` (the target's) name ``device``.

    A model's own code may name the device the script picked (the seq2seq tutorial's decoder makes its
    start tokens with ``device=device``; a module's ``.to(device)`` of a table kept on the CPU): replayed on
    the CPU, those tensors went to the target's device, the reference raised, and the layers were not
    compared, so a 1% matmul fault passed on the curves alone. A no-op where the side is on that type.
    """
    device = torch.device(device)
    if named is None or device.type == named:
        return nullcontext()
    return _DeviceRedirect(named, device)


@contextmanager
def default_dtype(dtype: torch.dtype | None):
    """Factory calls without a dtype (``torch.zeros(n)``) make ``dtype`` while active: a float64 golden run's
    model code must not silently compute parts in float32."""
    if dtype is None or not dtype.is_floating_point:
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def side_model(model: torch.nn.Module, device, dtype: torch.dtype | None = None, *, copy_model: bool = True):
    """The model as one side runs it: a deep copy (unless told to use it), on ``device``, in ``dtype``.

    The copy's parameters and buffers are made on ``device`` (in ``dtype``) directly, not copied on the CPU
    first and then moved: that first copy held every parameter once more and took a third to a half of the
    time the copy takes (timm's hrnet_w64 onto the emulated device: 0.24 s, now 0.14 s). ``Module.to`` still
    runs on the copy, for modules that do more there than move tensors (an LSTM's flat weights).
    """
    m = model_copy(model, _moved_tensors(model, device, dtype)) if copy_model else model
    if dtype is not None:
        m = m.to(dtype)
    return m.to(device)


def model_copy(model: torch.nn.Module, memo: dict | None = None) -> torch.nn.Module:
    """``copy.deepcopy(model, memo)``, with the functions the model keeps that close over its own parts bound
    to the copy's parts.

    ``deepcopy`` keeps a function as it is, so a copy of minGPT's Block, whose ``self.mlpf = lambda x:
    m.dropout(m.c_proj(m.act(m.c_fc(x))))`` closes over ``m = self.mlp``, called the original's layers: on
    the reference, the target's weights on the target's device ("MmBackward0 returned an invalid gradient ...
    expected device cpu but got neuron:0"); on a snapshot, the live model's weights, trained further since.
    Functions held in a module's attributes, and in its dicts and lists of them (hooks), are rebound.

    A tensor attribute computed from the parameters (pruning's ``weight = weight_orig * weight_mask``, the old
    ``weight_norm``'s ``weight``) is copied detached: ``deepcopy`` refuses a tensor with a history ("Only
    Tensors created explicitly by the user (graph leaves) support the deepcopy protocol"), and the module's
    forward pre-hook computes it afresh from the copy's own parameters at every call."""
    memo = {} if memo is None else memo
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and value.grad_fn is not None and id(value) not in memo:
                memo[id(value)] = value.detach().clone()
    copied = copy.deepcopy(model, memo)
    for module in copied.modules():
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType):
                module.__dict__[name] = _rebound(value, memo)
            elif isinstance(value, dict) and value and name not in ("_parameters", "_buffers", "_modules"):
                for key, item in list(value.items()):
                    if isinstance(item, types.FunctionType):
                        value[key] = _rebound(item, memo)
            elif isinstance(value, list):
                value[:] = [_rebound(item, memo) if isinstance(item, types.FunctionType) else item for item in value]
    return copied


def _rebound(fn: types.FunctionType, memo: dict) -> types.FunctionType:
    """``fn`` with every closure cell that holds an object ``deepcopy`` copied holding its copy instead."""
    if not fn.__closure__:
        return fn
    cells, changed = [], False
    for cell in fn.__closure__:
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell (a name assigned after the function was made)
            cells.append(cell)
            continue
        new = memo.get(id(content), content)  # deepcopy's memo maps each object it copied to its copy
        changed = changed or new is not content
        cells.append(types.CellType(new))
    if not changed:
        return fn
    bound = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, tuple(cells))
    bound.__kwdefaults__, bound.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    bound.__dict__.update(fn.__dict__)
    return bound


def _moved_tensors(model: torch.nn.Module, device, dtype: torch.dtype | None) -> dict[int, torch.Tensor]:
    """A ``deepcopy`` memo that gives each plain parameter and buffer of ``model`` its copy on ``device``, cast
    as ``Module.to(dtype)`` would cast it (floating and complex tensors only). What ``deepcopy`` would copy
    otherwise (a parameter subclass, a sparse or quantized tensor) is left to it, and to ``Module.to`` after."""
    memo: dict[int, torch.Tensor] = {}
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in memo or type(t) not in (torch.Tensor, torch.nn.Parameter) or t.layout != torch.strided \
                or t.is_quantized or t.is_meta:
            continue
        cast = dtype if dtype is not None and (t.is_floating_point() or t.is_complex()) else None
        value = t.detach()
        if cast is not None and cast != value.dtype:
            value = value.to(cast).to(device)  # cast where the tensor is, as Module.to(dtype) then .to(device)
        else:
            value = value.to(device, copy=True)
        if type(t) is torch.nn.Parameter:  # Parameter.__deepcopy__ keeps the data alone (no .grad, no attributes)
            memo[id(t)] = torch.nn.Parameter(value, t.requires_grad)
        else:  # Tensor.__deepcopy__ keeps a buffer's attributes too
            memo[id(t)] = value.requires_grad_(t.requires_grad)
            if t.__dict__:
                value.__dict__.update(copy.deepcopy(t.__dict__, memo))
    return memo


def plain_outputs(value: Any, depth: int = 0) -> Any:
    """Model outputs as nested dicts/lists of detached tensors (HF ModelOutputs become dicts; caches are dropped)."""
    if depth > 8:
        return None
    if isinstance(value, torch.Tensor):
        return value.detach()  # an attached output's graph would keep every parameter alive
    if isinstance(value, (bool, int, float)) or value is None:
        return value
    if isinstance(value, Mapping):
        out = {str(k): plain_outputs(v, depth + 1) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [plain_outputs(v, depth + 1) for v in value]
    return None  # caches and other objects: their content is already in the tensors we compare


def call_model(model, inputs) -> Any:
    """``model(*args, **kwargs)`` for inputs given as (args, kwargs), a dict of keyword arguments, or one value."""
    if isinstance(inputs, tuple) and len(inputs) == 2 and isinstance(inputs[1], dict) and isinstance(inputs[0], tuple):
        return model(*inputs[0], **inputs[1])
    if isinstance(inputs, dict):
        return model(**inputs)
    return model(inputs)


@dataclass(kw_only=True)
class ModelRun:
    """What one side computed. Tensors stay on the side's device; ``error`` is set instead of raising
    when ``capture_errors`` was asked for."""

    outputs: Any = None  # the first step's output, through ``keep_output``
    losses: list[torch.Tensor] = field(default_factory=list)  # one detached scalar per step
    grads: dict[str, torch.Tensor | None] | None = None  # parameter gradients of the last step
    params: dict[str, torch.Tensor] | None = None  # after the last step (with ``keep_params``)
    step_seconds: list[float] = field(default_factory=list)
    model: torch.nn.Module | None = None  # the side's model, as it ended
    runner: Any = None  # what was called: the model, or the compiled model
    error: BaseException | None = None
    error_phase: str = ""  # forward | backward | step

    @property
    def ok(self) -> bool:
        return self.error is None


def run_model(
    model: torch.nn.Module,
    *,
    device,
    inputs: Any | Callable[[int], Any],
    dtype: torch.dtype | None = None,
    forward: Callable[[Any, Any], Any] = call_model,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    grad_output: Any = None,
    steps: int = 1,
    optimizer_factory: Callable[[Any], Any] | None = None,
    train: bool | None = None,
    prepare: Callable[[torch.nn.Module], Any] | None = None,
    instrument: Callable[[torch.nn.Module], ContextManager] | None = None,
    keep_output: Callable[[Any], Any] = plain_outputs,
    keep_params: bool = False,
    copy_model: bool = True,
    seed: int | None = None,
    synchronize: Callable[[], None] | None = None,
    on_step: Callable[[int, float], None] | None = None,
    capture_errors: bool = False,
    loss_optional: bool = False,
) -> ModelRun:
    """Runs ``steps`` steps of ``model`` on one side.

    ``inputs``: the batch (on the CPU; moved and cast here), or ``inputs(step)``.
    ``forward(model, batch)`` returns the output; ``loss(output, batch)`` a
    scalar, from which the backward pass runs; without a loss, a backward pass
    starts from ``grad_output`` (gradients aligned with the output's floating
    tensors, None where none flowed) or does not run. With an optimizer every
    step ends with ``optimizer.step()``. ``train``: the module mode (None keeps
    the model's own). ``prepare`` wraps the side's model (torch.compile);
    ``instrument(model)`` is a context manager (hooks,
    dispatch modes) around each forward. ``copy_model=False`` trains ``model`` itself.
    ``loss_optional``: a loss that does not require grad skips the backward
    pass instead of failing it.
    """
    if seed is not None:
        torch.manual_seed(seed)
    run = ModelRun()
    m = side_model(model, device, dtype, copy_model=copy_model)
    run.model = m
    if train is not None:
        m.train(train)
    runner = prepare(m) if prepare is not None else m
    run.runner = runner
    optimizer = optimizer_factory(m.parameters()) if optimizer_factory is not None else None
    differentiates = loss is not None or grad_output is not None
    if differentiates:
        m.zero_grad(set_to_none=True)  # a copied model brings the .grad of its original
    batch_of = inputs if callable(inputs) else (lambda step: inputs)
    for step in range(steps):
        batch = to_device(batch_of(step), device, dtype)
        start = time.perf_counter()
        phase = "forward"
        try:
            with default_dtype(dtype):
                with (instrument(m) if instrument is not None else nullcontext()), \
                        (nullcontext() if differentiates else torch.no_grad()):
                    out = forward(runner, batch)
                if step == 0:
                    run.outputs = keep_output(out)
                phase = "backward"
                did = False
                if loss is not None:
                    value = loss(out, batch)
                    if not loss_optional or (isinstance(value, torch.Tensor) and value.requires_grad):
                        value.backward()
                        did = True
                    if isinstance(value, torch.Tensor):
                        run.losses.append(value.detach())
                elif grad_output is not None:
                    did = backward_from(out, grad_output, device, dtype)
                del out
            phase = "step"
            if did:
                run.grads = {n: (p.grad.detach() if p.grad is not None else None) for n, p in m.named_parameters()}
            if optimizer is not None:
                optimizer.step()
                m.zero_grad(set_to_none=True)  # the next step's gradients are new tensors: run.grads stays valid
            if synchronize is not None:
                synchronize()
        except Exception as exc:  # noqa: BLE001 - a failing side is a result, when the caller wants it so
            if not capture_errors:
                raise
            run.error, run.error_phase = exc, phase
            return run
        run.step_seconds.append(time.perf_counter() - start)
        if on_step is not None and run.losses:
            on_step(step, float(run.losses[-1].float().cpu()))
    if keep_params:
        run.params = {n: p.detach().clone() if not copy_model else p.detach() for n, p in m.named_parameters()}
    return run


def float_leaves(value) -> list[torch.Tensor]:
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())]


def backward_from(output, grad_output, device, dtype=None) -> bool:
    """A backward pass from given gradients of the output's floating tensors; False when none apply."""
    grads = list(grad_output) if isinstance(grad_output, (list, tuple)) else [grad_output]
    pairs = [(o, g) for o, g in zip(float_leaves(output), grads)
             if g is not None and o.requires_grad and g.shape == o.shape]
    if not pairs:
        return False
    torch.autograd.backward([o for o, _ in pairs], [to_device(g, device, dtype).to(o.dtype) for o, g in pairs])
    return True


__all__ = ["ModelRun", "backward_from", "call_model", "default_dtype", "device_named_as", "float_leaves", "model_copy",
           "names_device_type", "plain_outputs", "run_model", "same_layout_copy", "side_model", "to_device"]
