"""The emulated device's c10d backend: ``init_process_group(backend="neuron")`` over host memory.

Unchanged distributed code then runs on N emulated devices in N processes:
``init_process_group("neuron")`` (or the device-mapped form
``"cpu:gloo,neuron:neuron"``), ``init_device_mesh("neuron", ...)``, DTensor,
DDP and FSDP2. Every collective stages the device tensors on the host, runs
the matching collective of an inner gloo group (built on a prefix of the same
store), and copies the results back when it completes; the Work it returns
supports ``wait()``, ``get_future()`` (the C++ callers, such as DDP's
reducer, use both) and ``is_completed()``.

Two paths reach a Python process group: Python callers (``dist.all_reduce``)
look methods up on the object; C++ callers (DDP, functional collectives)
reach only the methods PyTorch's trampoline forwards (allreduce,
allreduce_coalesced, broadcast, allgather, all_gather_single(_coalesced),
reduce_scatter, reduce_scatter_single(_coalesced), all_to_all_single,
barrier, send, recv). Both are implemented here.

The numerics profile applies: a profile's ``collective_dtype`` (bf16 under
``all-bf16``) rounds what a reduction adds and what it returns to that dtype.
Faults (faults.py) on ops named ``c10d::<collective>`` break collectives on
purpose: ``drop`` (one rank's contribution is zeros), ``wrong_op`` (a SUM
reduces with MAX, any other op with SUM), ``stale`` (the output buffer is
left as it was), ``offset`` (the result lands at the start of the output's
storage, as if a view had no offset), ``perturb`` (results scaled by 1 + rel) and ``hang`` (the
collective never returns). ``rank=R`` limits a fault to one rank (``drop``
defaults to the last one).
"""

from __future__ import annotations

import fnmatch
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    ProcessGroupGloo,
    ReduceOptions,
    ReduceScatterOptions,
)
from torch.futures import Future

BACKEND_NAME = "neuron"
ReduceOp = dist.ReduceOp


# ---------------------------------------------------------------- faults and numerics
# The device's state, handed over by emulator.register() (this module never imports its package).
_active_faults: Callable[[], list] = list
_profile: Callable[[], Any] | None = None


def _fault(collective: str, rank: int, size: int, kinds: tuple[str, ...]):
    """The first installed fault of one of ``kinds`` on ``c10d::<collective>`` that applies to ``rank``."""
    for fault in _active_faults():
        if fault.kind not in kinds or not fnmatch.fnmatchcase(f"c10d::{collective}", fault.op):
            continue
        target = fault.rank if fault.rank >= 0 else (size - 1 if fault.kind == "drop" else rank)
        if target == rank:
            return fault
    return None


def _collective_dtype() -> torch.dtype | None:
    name = _profile().collective_dtype if _profile is not None else ""
    return getattr(torch, name) if name else None


def _round(t: torch.Tensor) -> None:
    """Rounds a floating host tensor in place to the profile's collective dtype (what the device adds in)."""
    dtype = _collective_dtype()
    if dtype is not None and t.is_floating_point() and t.dtype != dtype:
        t.copy_(t.to(dtype))


class _Collective:
    """One collective's faults and numerics on this rank: applied to the host copies before and after."""

    def __init__(self, group: "NeuronProcessGroup", name: str, *, reduces: bool = False):
        # Only numbers are kept: a callback that held the group could drop its last reference on gloo's
        # own thread, whose destructor would then join itself (an abort at exit).
        self.name, self.reduces = name, reduces
        rank, size = group.rank(), group.size()
        self.rank, self.size = rank, size
        if _fault(name, rank, size, ("hang",)) is not None:
            while True:  # a collective that never returns: the harness must time the case out
                time.sleep(3600)
        self.drop = _fault(name, rank, size, ("drop",)) is not None
        self.wrong_op = _fault(name, rank, size, ("wrong_op",)) is not None
        self.stale = _fault(name, rank, size, ("stale",)) is not None
        self.offset = _fault(name, rank, size, ("offset",)) is not None
        perturb = _fault(name, rank, size, ("perturb",))
        self.scale = 1.0 + perturb.rel if perturb is not None else 1.0

    def op(self, op):
        if not self.wrong_op:
            return op
        return ReduceOp.MAX if op == ReduceOp.SUM else ReduceOp.SUM

    def inputs(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's contribution: zeros when dropped; rounded for a reduction."""
        for t in tensors:
            if self.drop:
                t.zero_()
            if self.reduces:
                _round(t)
        return tensors

    def outgoing(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """What a send puts on the wire: a perturbed send scales it (a send has no result to scale)."""
        if self.scale != 1.0:
            with torch.no_grad():
                for t in tensors:
                    if t.is_floating_point() or t.is_complex():
                        t.mul_(self.scale)
        return tensors

    def copy_back_lists(self, dsts: list[list[torch.Tensor]], srcs: list[list[torch.Tensor]]) -> None:
        for outs, hosts in zip(dsts, srcs):
            for dst, src in zip(outs, hosts):
                self.copy_back(dst, src)

    def copy_back(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        if self.stale:
            return
        if self.reduces:
            _round(src)
        with torch.no_grad():
            if self.scale != 1.0 and (src.is_floating_point() or src.is_complex()):
                src = src * self.scale
            if self.offset and dst.storage_offset():  # the view's offset ignored: its storage's start written
                dst = dst.as_strided(dst.shape, dst.stride(), 0)
            if dst is not src:
                dst.copy_(src)


# ---------------------------------------------------------------- staging on the host
def _host(t: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of ``t`` (always a copy: faults and rounding must not touch the caller's tensor)."""
    return t.detach().to("cpu", copy=True).contiguous()


def _host_empty(t: torch.Tensor) -> torch.Tensor:
    return torch.empty(t.shape, dtype=t.dtype, device="cpu")


def _avg_div(t: torch.Tensor, n: int) -> None:
    if t.is_floating_point() or t.is_complex():
        t.div_(n)
    else:
        t.copy_(torch.div(t, n, rounding_mode="trunc"))


def _reduce_options(cls, opts, op):
    """Options of ``cls`` like ``opts`` with another reduce op (gloo has no AVG for every dtype: SUM, then divide)."""
    new = cls()
    new.reduceOp = op
    new.timeout = opts.timeout
    if hasattr(opts, "rootRank"):
        new.rootRank, new.rootTensor = opts.rootRank, opts.rootTensor
    return new


# ---------------------------------------------------------------- work
class NeuronWork(dist._Work):
    """A gloo Work whose completion copies the results back to the device, exactly once."""

    def __init__(self, gloo_work, finalize=None, result=None):
        super().__init__()
        self._gloo_work = gloo_work
        self._finalize = finalize
        self._result = result if result is not None else []
        self._lock = threading.Lock()
        self._finished = False
        self._future: Future | None = None
        future = None
        if gloo_work is not None:
            try:
                future = gloo_work.get_future()
            except RuntimeError:  # gloo's reduce_scatter and send/recv have no future
                future = None
        if future is not None:
            self._future = future.then(self._on_done)

    def _finish(self):
        with self._lock:
            if not self._finished:
                if self._finalize is not None:
                    self._finalize()
                self._finished = True
        return self._result

    def _on_done(self, future):
        future.value()  # gloo's error, raised into the chained future
        return self._finish()

    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if self._future is not None:
            self._future.wait()
        else:
            if self._gloo_work is not None:
                self._gloo_work.wait()
            self._finish()
        return True

    def get_future(self) -> Future:
        if self._future is None:
            future = Future()

            def complete():
                try:
                    if self._gloo_work is not None:
                        self._gloo_work.wait()
                    future.set_result(self._finish())
                except Exception as exc:  # noqa: BLE001 - handed to whoever waits on the future
                    future.set_exception(exc)

            self._future = future
            threading.Thread(target=complete, daemon=True).start()
        return self._future

    def is_completed(self) -> bool:
        return self._future.done() if self._future is not None else self._finished

    def is_success(self) -> bool:
        return self.is_completed()

    def result(self):
        self.wait()
        return self._result


# ---------------------------------------------------------------- the process group
class NeuronProcessGroup(dist.ProcessGroup):
    """The ``neuron`` backend: collectives over host memory through an inner gloo group."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta):
        super().__init__(store, rank, size)
        self._gloo = ProcessGroupGloo(dist.PrefixStore("neuron_gloo/", store), rank, size, timeout)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def __repr__(self) -> str:
        return f"NeuronProcessGroup(rank={self.rank()}, size={self.size()})"

    # A Python group has no C++ backends to hold its name; functional collectives need one.
    def setGroupName(self, name: str) -> None:
        self._group_name = name
        self._gloo._set_group_uid(name)

    def getGroupName(self) -> str:
        return getattr(self, "_group_name", "")

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    def getGroupDesc(self) -> str:
        return getattr(self, "_group_desc", "")

    def _get_backend(self, device=None):
        """batch_isend_irecv and the coalescing manager ask for the per-device backend."""
        return self._gloo

    # ------------------------------------------------------------ reductions
    def allreduce(self, tensors, opts=None):
        if opts is None or isinstance(opts, (ReduceOp, ReduceOp.RedOpType)):
            op = opts if opts is not None else ReduceOp.SUM
            opts = AllreduceOptions()
            opts.reduceOp = op
        c = _Collective(self, "allreduce", reduces=True)
        op = c.op(opts.reduceOp)
        avg = op == ReduceOp.AVG
        host = c.inputs([_host(t) for t in tensors])
        work = self._gloo.allreduce(host, _reduce_options(AllreduceOptions, opts, ReduceOp.SUM if avg else op))

        def finish():
            for t, h in zip(tensors, host):
                if avg:
                    _avg_div(h, c.size)
                c.copy_back(t, h)

        return NeuronWork(work, finish, list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        works = []
        for t in tensors:
            one = AllreduceOptions()
            one.reduceOp = opts.reduceOp if opts is not None else ReduceOp.SUM
            if opts is not None:
                one.timeout = opts.timeout
            works.append(self.allreduce([t], one))
        return NeuronWork(None, lambda: [w.wait() for w in works], list(tensors))

    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else ReduceOptions()
        c = _Collective(self, "reduce", reduces=True)
        op = c.op(opts.reduceOp)
        avg = op == ReduceOp.AVG
        host = c.inputs([_host(t) for t in tensors])
        work = self._gloo.reduce(host, _reduce_options(ReduceOptions, opts, ReduceOp.SUM if avg else op))

        root = opts.rootRank

        def finish():
            if c.rank != root:
                return
            for t, h in zip(tensors, host):
                if avg:
                    _avg_div(h, c.size)
                c.copy_back(t, h)

        return NeuronWork(work, finish, list(tensors))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        c = _Collective(self, "reduce_scatter", reduces=True)
        op = c.op(opts.reduceOp)
        avg = op == ReduceOp.AVG
        host_in = [c.inputs([_host(t) for t in ins]) for ins in input_tensors]
        host_out = [_host_empty(o) for o in output_tensors]
        work = self._gloo.reduce_scatter(host_out, host_in,
                                         _reduce_options(ReduceScatterOptions, opts, ReduceOp.SUM if avg else op))

        def finish():
            for o, h in zip(output_tensors, host_out):
                if avg:
                    _avg_div(h, c.size)
                c.copy_back(o, h)

        return NeuronWork(work, finish, output_tensors)

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else ReduceScatterOptions()
        c = _Collective(self, "reduce_scatter", reduces=True)
        op = c.op(opts.reduceOp)
        avg = op == ReduceOp.AVG
        (host_in,) = c.inputs([_host(input)])
        host_out = _host_empty(output)
        work = self._gloo.reduce_scatter_single(host_out, host_in,
                                                _reduce_options(ReduceScatterOptions, opts,
                                                                ReduceOp.SUM if avg else op))

        def finish():
            if avg:
                _avg_div(host_out, c.size)
            c.copy_back(output, host_out)

        return NeuronWork(work, finish, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return NeuronWork(None, lambda: [w.wait() for w in works], list(outputs))

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    # ------------------------------------------------------------ broadcast, gathers, scatter
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        c = _Collective(self, "broadcast")
        host = [_host(t) for t in tensors]
        if self.rank() == opts.rootRank:
            c.inputs(host)
        work = self._gloo.broadcast(host, opts)
        return NeuronWork(work, lambda: [c.copy_back(t, h) for t, h in zip(tensors, host)], list(tensors))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        c = _Collective(self, "all_gather")
        host_in = c.inputs([_host(t) for t in input_tensors])
        host_out = [[_host_empty(o) for o in outs] for outs in output_tensors]
        work = self._gloo.allgather(host_out, host_in, opts)

        return NeuronWork(work, lambda: c.copy_back_lists(output_tensors, host_out), output_tensors)

    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        c = _Collective(self, "all_gather")
        # Flat, so that the stacked (W, *in) output form works too: gloo takes only (W * in[0], *in[1:]).
        (host_in,) = c.inputs([_host(input).reshape(-1)])
        host_out = torch.empty(output.numel(), dtype=output.dtype, device="cpu")
        work = self._gloo._allgather_base(host_out, host_in, opts)
        return NeuronWork(work, lambda: c.copy_back(output, host_out.view(output.shape)), [output])

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return NeuronWork(None, lambda: [w.wait() for w in works], list(outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        c = _Collective(self, "gather")
        host_in = c.inputs([_host(t) for t in input_tensors])
        host_out = [[_host_empty(o) for o in outs] for outs in output_tensors]
        work = self._gloo.gather(host_out, host_in, opts)

        return NeuronWork(work, lambda: c.copy_back_lists(output_tensors, host_out), output_tensors)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        c = _Collective(self, "scatter")
        host_in = [c.inputs([_host(t) for t in ins]) for ins in input_tensors]
        host_out = [_host_empty(o) for o in output_tensors]
        work = self._gloo.scatter(host_out, host_in, opts)
        return NeuronWork(work, lambda: [c.copy_back(o, h) for o, h in zip(output_tensors, host_out)],
                          output_tensors)

    # ------------------------------------------------------------ all-to-all
    def alltoall(self, output_tensors, input_tensors, opts=None):
        # gloo's alltoall wants equal sizes; flat concatenations through alltoall_base take uneven ones.
        opts = opts if opts is not None else AllToAllOptions()
        c = _Collective(self, "all_to_all")
        (host_in,) = c.inputs([torch.cat([_host(t).reshape(-1) for t in input_tensors])])
        out_splits = [o.numel() for o in output_tensors]
        host_out = torch.empty(sum(out_splits), dtype=output_tensors[0].dtype, device="cpu")
        work = self._gloo.alltoall_base(host_out, host_in, out_splits, [t.numel() for t in input_tensors], opts)

        def finish():
            for o, h in zip(output_tensors, host_out.split(out_splits)):
                c.copy_back(o, h.view(o.shape))

        return NeuronWork(work, finish, output_tensors)

    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else AllToAllOptions()
        c = _Collective(self, "all_to_all")
        (host_in,) = c.inputs([_host(input)])
        host_out = _host_empty(output)
        work = self._gloo.alltoall_base(host_out, host_in, list(output_split_sizes), list(input_split_sizes), opts)
        return NeuronWork(work, lambda: c.copy_back(output, host_out), [output])

    alltoall_base = all_to_all_single

    # ------------------------------------------------------------ point to point, barrier
    def send(self, tensors, dst_rank, tag=0):
        c = _Collective(self, "send")
        host = c.outgoing(c.inputs([_host(t) for t in tensors]))  # kept alive by the work until sent
        return NeuronWork(self._gloo.send(host, dst_rank, tag), None, host)

    def recv(self, tensors, src_rank, tag=0):
        c = _Collective(self, "recv")
        host = [_host_empty(t) for t in tensors]
        work = self._gloo.recv(host, src_rank, tag)
        return NeuronWork(work, lambda: [c.copy_back(t, h) for t, h in zip(tensors, host)], list(tensors))

    def recv_anysource(self, tensors, tag=0):
        c = _Collective(self, "recv")
        host = [_host_empty(t) for t in tensors]
        gloo_work = self._gloo.recv_anysource(host, tag)
        work = NeuronWork(gloo_work, lambda: [c.copy_back(t, h) for t, h in zip(tensors, host)], list(tensors))
        work._source_rank = gloo_work._source_rank  # type: ignore[attr-defined]
        return work

    def barrier(self, opts=None):
        _Collective(self, "barrier")
        options = BarrierOptions()
        if opts is not None:
            options.timeout = opts.timeout
        return NeuronWork(self._gloo.barrier(options), None, [])


def _create(store, rank, size, timeout):
    return NeuronProcessGroup(store, rank, size, timeout)


def register(*, active_faults: Callable[[], list], profile: Callable[[], Any]) -> None:
    """Registers the c10d backend ``neuron`` (idempotent). It serves the CPU too, so that a plain
    ``backend="neuron"`` group takes CPU tensors (object collectives, CPU barriers) as well.
    ``active_faults`` and ``profile``: the device's, read at each collective."""
    global _active_faults, _profile
    _active_faults, _profile = active_faults, profile
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=False, devices=["cpu", BACKEND_NAME])


__all__ = ["BACKEND_NAME", "NeuronProcessGroup", "NeuronWork", "register"]
