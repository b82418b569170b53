"""The collectives suite: every collective on the target's process group against gloo on the CPU.

One case per collective (and reduce op) and world size; its samples are the
dtypes x sizes below, the sizes across the 128-partition tile boundary and a
reduction past 65,536 elements. Each rank builds its inputs from the case's
seed and its rank, runs the collective on the target's device through the
default group (``async_op=True``, then ``wait()``: the work handles are
exercised too) and the same collective on the CPU through a gloo group in
the same process; both results come back to the case's worker, where the one
judge compares them (diff.judge, with the precision model's entry for the
collective where the profile reduces in a narrower dtype).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

FLOATS = ("float32", "bfloat16", "float16")
INTS = ("int64", "int32")
SIZES = (1, 127, 128, 129, 65537)
SMALL_SIZES = (1, 127, 128, 129)  # collectives whose output grows with the world size squared


@dataclass(frozen=True, slots=True, kw_only=True)
class Collective:
    """One case of the suite: a collective, its reduce op, and the dtypes and sizes of its samples."""

    name: str  # the case name, e.g. "all_reduce.sum"
    run: Callable  # (x, rank, world, group, device) -> output tensors
    dtypes: tuple[str, ...] = FLOATS + INTS
    sizes: tuple[int, ...] = SIZES
    low: float = -3.0  # the inputs' range
    high: float = 3.0
    fault_name: str = ""  # what the process group calls it (c10d::<fault_name>)


def _op(name: str):
    import torch.distributed as dist

    return getattr(dist.ReduceOp, name.upper())


def _all_reduce(op: str):
    def run(x, rank, world, group, device):
        import torch.distributed as dist

        y = x.clone()
        dist.all_reduce(y, _op(op), group=group, async_op=True).wait()
        return [y]

    return run


def _all_gather(x, rank, world, group, device):
    import torch.distributed as dist

    outs = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(outs, x, group=group, async_op=True).wait()
    return outs


def _all_gather_into_tensor(x, rank, world, group, device):
    import torch.distributed as dist

    out = torch.empty(world * x.numel(), dtype=x.dtype, device=device)
    dist.all_gather_into_tensor(out, x, group=group, async_op=True).wait()
    return [out]


def _reduce_scatter(op: str):
    def run(x, rank, world, group, device):
        import torch.distributed as dist

        chunks = [x * (j + 1) for j in range(world)]
        out = torch.empty_like(x)
        dist.reduce_scatter(out, chunks, _op(op), group=group, async_op=True).wait()
        return [out]

    return run


def _reduce_scatter_tensor(op: str):
    def run(x, rank, world, group, device):
        import torch.distributed as dist

        full = torch.cat([x * (j + 1) for j in range(world)])
        out = torch.empty_like(x)
        dist.reduce_scatter_tensor(out, full, _op(op), group=group, async_op=True).wait()
        return [out]

    return run


def _uneven(n: int, sender: int, receiver: int) -> int:
    """How many elements ``sender`` sends ``receiver`` in the uneven all-to-alls."""
    return max(1, n // 2 + sender + 2 * receiver)


def _long(x: torch.Tensor, n: int) -> torch.Tensor:
    """At least ``n`` elements of ``x``'s values, repeated."""
    return x.reshape(-1).repeat(n // x.numel() + 1)


def _all_to_all(x, rank, world, group, device):
    import torch.distributed as dist

    sizes_out = [_uneven(x.numel(), rank, j) for j in range(world)]
    flat = _long(x, sum(sizes_out))
    inputs = list(flat[: sum(sizes_out)].split(sizes_out))
    outputs = [torch.empty(_uneven(x.numel(), j, rank), dtype=x.dtype, device=device) for j in range(world)]
    if device.type == "cpu":  # gloo's list all_to_all takes equal sizes only: the reference goes flat
        out = torch.empty(sum(o.numel() for o in outputs), dtype=x.dtype)
        dist.all_to_all_single(out, torch.cat(inputs), [o.numel() for o in outputs], sizes_out, group=group)
        return list(out.split([o.numel() for o in outputs]))
    dist.all_to_all(outputs, [t.clone() for t in inputs], group=group, async_op=True).wait()
    return outputs


def _all_to_all_single(x, rank, world, group, device):
    import torch.distributed as dist

    in_splits = [_uneven(x.numel(), rank, j) for j in range(world)]
    flat = _long(x, sum(in_splits))
    out_splits = [_uneven(x.numel(), j, rank) for j in range(world)]
    source = flat[: sum(in_splits)].clone()
    out = torch.empty(sum(out_splits), dtype=x.dtype, device=device)
    dist.all_to_all_single(out, source, out_splits, in_splits, group=group, async_op=True).wait()
    return [out]


def _broadcast(x, rank, world, group, device):
    import torch.distributed as dist

    src = world - 1
    y = x.clone() if rank == src else torch.zeros_like(x)
    dist.broadcast(y, src=src, group=group, async_op=True).wait()
    return [y]


def _send_recv(x, rank, world, group, device):
    import torch.distributed as dist

    out = torch.zeros_like(x)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(world))
    send = dist.isend(x.clone(), dst=ranks[(rank + 1) % world], group=group)
    recv = dist.irecv(out, src=ranks[(rank - 1) % world], group=group)
    send.wait()
    recv.wait()
    return [out]


def _barrier(x, rank, world, group, device):
    import torch.distributed as dist

    dist.barrier(group=group, async_op=True).wait()
    dist.barrier(group=group)
    return [x.clone()]


def _in_buffer(run):
    """The collective on a view at an offset inside a larger buffer, which comes back whole: a backend that
    ignores the storage offset, or writes past the view, shows in the buffer's other elements."""
    def in_buffer(x, rank, world, group, device):
        buffer = torch.full((x.numel() + 5,), 7, dtype=x.dtype, device=device)
        view = buffer[2: 2 + x.numel()]
        view.copy_(x)
        outputs = run(view, rank, world, group, device, out_of=view)
        return [buffer, *outputs]

    return in_buffer


def _all_reduce_in_place(x, rank, world, group, device, out_of=None):
    import torch.distributed as dist

    dist.all_reduce(x, group=group)
    return []


def _broadcast_in_place(x, rank, world, group, device, out_of=None):
    import torch.distributed as dist

    if rank != 0:
        x.zero_()
    dist.broadcast(x, src=0, group=group)
    return []


def _all_gather_into_view(x, rank, world, group, device, out_of=None):
    import torch.distributed as dist

    out = torch.full((world * x.numel() + 3,), 5, dtype=x.dtype, device=device)
    dist.all_gather_into_tensor(out[1: 1 + world * x.numel()], x, group=group)
    return [out]


def _overlapped(x, rank, world, group, device):
    """Three async all-reduces in flight at once, waited for in reverse order: a backend that mixes up its
    outstanding works, or completes a wait before its result is written, shows here."""
    import torch.distributed as dist

    tensors = [x * (i + 1) for i in range(3)]
    works = [dist.all_reduce(t, group=group, async_op=True) for t in tensors]
    for work in reversed(works):
        work.wait()
    return tensors


def _suite() -> dict[str, Collective]:
    cases = [Collective(name=f"all_reduce.{op}", run=_all_reduce(op), fault_name="allreduce")
             for op in ("sum", "max", "min")]
    cases += [
        Collective(name="all_reduce.avg", run=_all_reduce("avg"), dtypes=FLOATS, fault_name="allreduce"),
        # products of values near 1, so that 4 ranks stay finite in float16
        Collective(name="all_reduce.product", run=_all_reduce("product"), low=0.5, high=1.5,
                   dtypes=FLOATS + ("int64",), fault_name="allreduce"),
        Collective(name="all_gather", run=_all_gather, fault_name="all_gather"),
        Collective(name="all_gather_into_tensor", run=_all_gather_into_tensor, fault_name="all_gather"),
        Collective(name="reduce_scatter.sum", run=_reduce_scatter("sum"), fault_name="reduce_scatter"),
        Collective(name="reduce_scatter_tensor.sum", run=_reduce_scatter_tensor("sum"), fault_name="reduce_scatter"),
        Collective(name="reduce_scatter_tensor.avg", run=_reduce_scatter_tensor("avg"), dtypes=FLOATS,
                   fault_name="reduce_scatter"),
        Collective(name="all_to_all", run=_all_to_all, sizes=SMALL_SIZES, fault_name="all_to_all"),
        Collective(name="all_to_all_single", run=_all_to_all_single, sizes=SMALL_SIZES, fault_name="all_to_all"),
        Collective(name="broadcast", run=_broadcast, fault_name="broadcast"),
        Collective(name="send_recv", run=_send_recv, fault_name="send"),
        Collective(name="barrier", run=_barrier, dtypes=("float32",), sizes=(1,), fault_name="barrier"),
        Collective(name="all_reduce.overlapped", run=_overlapped, fault_name="allreduce"),
        Collective(name="all_reduce.view", run=_in_buffer(_all_reduce_in_place), sizes=(1, 129),
                   fault_name="allreduce"),
        Collective(name="broadcast.view", run=_in_buffer(_broadcast_in_place), sizes=(1, 129),
                   fault_name="broadcast"),
        Collective(name="all_gather_into_tensor.view", run=_in_buffer(_all_gather_into_view), sizes=(1, 129),
                   fault_name="all_gather"),
    ]
    return {c.name: c for c in cases}


COLLECTIVES = _suite()


def sample_input(collective: Collective, dtype: str, size: int, *, seed: int, rank: int) -> torch.Tensor:
    """Rank ``rank``'s input for one sample, the same on every side (a CPU tensor)."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + size * 7919 + rank * 104_729) % 2**63)
    dt = getattr(torch, dtype)
    values = torch.rand(size, generator=g, dtype=torch.float64) * (collective.high - collective.low) + collective.low
    if dt.is_floating_point:
        return values.to(dt)
    return values.round().to(dt)


def samples(collective: Collective) -> list[tuple[str, int]]:
    return [(dtype, size) for dtype in collective.dtypes for size in collective.sizes]


def compare_samples(samples, target) -> dict[str, Any]:
    """Each sample run on the CPU reference side, then on the target: ``samples`` yields ``(key, run)`` with
    ``run(reference: bool)`` returning output tensors. Every rank runs every sample in the same order, so the
    groups stay in step; after a target failure the later samples are not run (they could hang).

    Returns ``{key: {"target": [...], "reference": [...], "devices": [...]}}`` (CPU tensors; the device types
    of the target's outputs), ``{key: {"skip": ...}}`` where the CPU fails, ``{key: {"error": ...}}``.
    """
    results: dict[str, Any] = {}
    for key, run in samples:
        try:
            expected = [t.detach().cpu() for t in run(True)]
        except Exception as exc:  # noqa: BLE001 - the CPU cannot do it: not the target's fault
            results[key] = {"skip": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            continue
        try:
            actual = run(False)
            target.synchronize()
        except Exception as exc:  # noqa: BLE001 - the target's failure is the sample's verdict
            results[key] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
                            "error_type": type(exc).__name__}
            break  # the groups may be out of step now: later samples would hang
        results[key] = {"target": [t.detach().cpu() for t in actual], "reference": expected,
                        "devices": sorted({t.device.type for t in actual})}
    return results


def rank_main(name: str, seed: int, target_spec: str, backend_modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """One rank of a collectives case: every sample on the target's group and on a gloo group on the CPU."""
    import torch.distributed as dist

    from conformance.target import resolve_target

    from .backends import init_target_group

    target = resolve_target(target_spec, backend_modules=backend_modules)
    init_target_group(target)
    reference_group = dist.new_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    collective = COLLECTIVES[name]
    cpu = torch.device("cpu")

    def sample(dtype: str, size: int):
        x = sample_input(collective, dtype, size, seed=seed, rank=rank)

        def run(reference: bool):
            if reference:
                return collective.run(x.clone(), rank, world, reference_group, cpu)
            return collective.run(x.to(target.device), rank, world, None, target.device)

        return f"{dtype}/{size}", run

    try:
        return compare_samples((sample(dtype, size) for dtype, size in samples(collective)), target)
    finally:
        dist.destroy_process_group()
