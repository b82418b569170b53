"""The DTensor suite: redistribution between placements, and sharded ops, on the target's device mesh.

A case is one redistribution (``redistribute.shard0.replicate``: a tensor
sharded on dim 0 made replicated; on a 2-D mesh at 4 ranks and more,
``redistribute2d.*`` moves between pairs of placements) or one op on
sharded operands (``op.mm.rowwise``: a row-wise sharded matmul, whose
partial sums DTensor reduces). Its samples are dtypes x shapes, even and
uneven across the ranks and across the 128-partition tile boundary. Every
rank runs the same DTensor code twice, on a mesh of the target's device and
on a CPU mesh (gloo), and brings back its local shard and the full tensor of
each; the one judge compares them (diff.judge). A wrong shard, a lost
partial sum, or an op whose sharding the device computes wrongly shows in
the local shards even where the full tensor hides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

DTYPES = ("float32", "bfloat16", "int64")
SHAPES = ((8, 6), (7, 5), (129, 3))  # even, uneven over 2 and 4 ranks, past a tile
PLACEMENTS = ("shard0", "shard1", "replicate", "partial", "partial_max")


def placement(name: str):
    from torch.distributed.tensor import Partial, Replicate, Shard

    return {"shard0": Shard(0), "shard1": Shard(1), "replicate": Replicate(), "partial": Partial(),
            "partial_max": Partial("max")}[name]


@dataclass(frozen=True, slots=True, kw_only=True)
class DTensorCase:
    """One case: ``run(x, mesh, rank)`` builds DTensors from the global input ``x`` (or this rank's
    contribution, for a partial source) and returns the DTensor result."""

    name: str
    run: Callable
    mesh_dims: int = 1
    dtypes: tuple[str, ...] = DTYPES
    ops: tuple[str, ...] = ()  # the ATen ops it computes (their precision entries judge it)
    per_rank: bool = False  # a partial source: each rank's input is its own contribution


def _source(x: torch.Tensor, mesh, names: tuple[str, ...]):
    """``x`` laid out on ``mesh`` by ``names``; a partial placement takes ``x`` as this rank's contribution."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    placements = [placement(n) for n in names]
    if any(n.startswith("partial") for n in names):
        return DTensor.from_local(x, mesh, placements, run_check=False)
    return distribute_tensor(x, mesh, placements)


def _redistribute(src: tuple[str, ...], dst: tuple[str, ...]):
    def run(x, mesh, rank):
        return _source(x, mesh, src).redistribute(mesh, [placement(n) for n in dst])

    return run


def _op(fn: Callable, layouts: tuple[tuple[str, ...], ...], shapes: Callable):
    """``fn`` of operands laid out by ``layouts``; ``shapes(x)`` makes the global operands from the input."""
    def run(x, mesh, rank):
        return fn(*(_source(o, mesh, lay) for o, lay in zip(shapes(x), layouts)))

    return run


def _pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two matmul operands from one input: (m, k) and (k, k)."""
    k = x.shape[1]
    w = (torch.arange(k * k, dtype=torch.float64).reshape(k, k).sin() * 2).to(x.dtype)
    return x, w


def _suite() -> dict[str, DTensorCase]:
    cases = []
    for src in PLACEMENTS:
        for dst in PLACEMENTS[:4]:
            # DTensor moves to a partial placement from shards only, and between partials not at all.
            if src == dst or (dst == "partial" and not src.startswith("shard")):
                continue
            cases.append(DTensorCase(name=f"redistribute.{src}.{dst}", run=_redistribute((src,), (dst,)),
                                     per_rank=src.startswith("partial")))
    for src, dst in ((("shard0", "shard1"), ("replicate", "replicate")),
                     (("replicate", "replicate"), ("shard1", "shard0")),
                     (("shard0", "shard0"), ("shard1", "replicate")),
                     (("partial", "shard0"), ("shard0", "replicate")),
                     (("shard0", "replicate"), ("replicate", "shard1"))):
        cases.append(DTensorCase(name=f"redistribute2d.{'-'.join(src)}.{'-'.join(dst)}", mesh_dims=2,
                                 run=_redistribute(src, dst), per_rank="partial" in src))
    floats = ("float32", "bfloat16")
    cases += [
        DTensorCase(name="op.mm.colwise", run=_op(torch.mm, (("replicate",), ("shard1",)), _pair), dtypes=floats,
                    ops=("aten::mm",)),
        DTensorCase(name="op.mm.rowwise", run=_op(torch.mm, (("shard1",), ("shard0",)), _pair), dtypes=floats,
                    ops=("aten::mm",)),
        DTensorCase(name="op.sum.shard0", run=_op(lambda a: a.sum(0), (("shard0",),), lambda x: (x,)),
                    ops=("aten::sum",)),
        DTensorCase(name="op.softmax.shard0", run=_op(lambda a: a.softmax(-1), (("shard0",),), lambda x: (x,)),
                    dtypes=floats, ops=("aten::_softmax",)),
        DTensorCase(name="op.add.partial", run=_op(lambda a, b: a + b, (("partial",), ("partial",)),
                                                  lambda x: (x, x * 0.5)), dtypes=floats, ops=("aten::add",), per_rank=True),
    ]
    return {c.name: c for c in cases}


DTENSOR_CASES = _suite()


def fits(name: str, world: int) -> str:
    """Why ``world`` ranks cannot run the case ("" when they can)."""
    case = DTENSOR_CASES[name]
    if case.mesh_dims == 2 and (world < 4 or world % 2):
        return "a 2-D mesh needs an even number of ranks, at least 4"
    return ""


def sample_input(dtype: str, shape: tuple[int, ...], *, seed: int, rank: int) -> torch.Tensor:
    """The global input (the same on every rank), or, for a partial source, this rank's contribution."""
    g = torch.Generator().manual_seed((seed * 1_000_003 + shape[0] * 7919 + rank * 104_729) % 2**63)
    values = torch.rand(shape, generator=g, dtype=torch.float64) * 6 - 3
    dt = getattr(torch, dtype)
    return values.to(dt) if dt.is_floating_point else values.round().to(dt)


def rank_main(name: str, seed: int, target_spec: str, backend_modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """One rank of a DTensor case: every sample on a mesh of the target's device and on a CPU mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from conformance.target import resolve_target

    from .backends import init_target_group
    from .collectives import compare_samples

    target = resolve_target(target_spec, backend_modules=backend_modules)
    init_target_group(target)
    rank, world = dist.get_rank(), dist.get_world_size()
    case = DTENSOR_CASES[name]
    shape = (world,) if case.mesh_dims == 1 else (2, world // 2)
    # The reference mesh gets gloo groups of its own: the emulated backend serves CPU tensors too, and a
    # fault injected into it must not reach the reference.
    meshes = {True: init_device_mesh("cpu", shape, backend_override={d: "gloo" for d in range(len(shape))}),
              False: init_device_mesh(target.device.type, shape)}

    def sample(dtype: str, size: tuple[int, ...]):
        x = sample_input(dtype, size, seed=seed, rank=rank if case.per_rank else 0)

        def run(reference: bool):
            mesh = meshes[reference]
            result = case.run(x.to(mesh.device_type), mesh, rank)
            return [result.to_local(), result.full_tensor()]

        return f"{dtype}/{'x'.join(map(str, size))}", run

    try:
        return compare_samples((sample(dtype, size) for dtype in case.dtypes for size in SHAPES), target)
    finally:
        dist.destroy_process_group()
