"""Parallelism parity: a zoo model trained K steps on N ranks of the target against one CPU process.

Every rank builds the same zoo configuration (same seed, so the same initial
weights) and trains it with the zoo's optimizer; rank ``r`` takes batch
``make_batch(step * N + r)`` at each step. Setups:

- ``ddp``: ``DistributedDataParallel`` (gradients averaged by all-reduce);
- ``fsdp2``: ``fully_shard`` on every block (:func:`shard_units`), then the
  root (parameters and gradients sharded, all-gathered and reduce-scattered);
  ``fsdp2-keep`` the same with ``reshard_after_forward=False``;
- ``tp``: tensor parallelism (``ColwiseParallel`` then ``RowwiseParallel`` on
  every block's MLP, DTensor underneath) of a tiny transformer; its ranks
  share each step's batch.

The reference is one CPU process doing what the ranks do together: each
step, the gradient of every rank's batch, averaged, then one optimizer step.
Per-step losses (the mean over ranks), the last step's gradients and the
parameters after K steps, gathered to full tensors on rank 0, go through the
one judge with the model tolerances; its float64 golden (the same reference
in float64) absorbs the different order in which the ranks' gradients are
summed, so a correct backend passes bit for bit or within that band.
"""

from __future__ import annotations

from typing import Any

import torch

MODELS = ("hf/gpt2:causal_lm", "world/rssm")  # the tiny GPT and the world model
TP_MODELS = ("flex/causal_lm",)  # a tiny transformer of nn.Linear layers (tensor parallelism shards those)
SETUPS = ("ddp", "fsdp2", "fsdp2-keep", "tp")
DEFAULT_STEPS = 3


def models_for(setup: str) -> tuple[str, ...]:
    return TP_MODELS if setup == "tp" else MODELS


def data_ranks(setup: str, world: int) -> int:
    """How many different batches a step takes: one per rank for data parallelism, one for tensor parallelism
    (its ranks share the batch and split the layers)."""
    return 1 if setup == "tp" else world


def _config(name: str, seed: int, steps: int):
    from model_zoo import ModelConfig

    attn = "sdpa" if name.startswith("flex/") else "default"  # FlexAttention has no CPU backward
    return ModelConfig(arch=name, mode="steps", steps=steps or DEFAULT_STEPS, seed=seed, attn=attn)


def _tensor_parallel(model: torch.nn.Module, mesh) -> torch.nn.Module:
    """Megatron-style MLP sharding of every block: the first Linear by columns, the second by rows."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    plan = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential):
            linears = [n for n, m in module.named_children() if isinstance(m, torch.nn.Linear)]
            if len(linears) == 2:
                plan[f"{name}.{linears[0]}"] = ColwiseParallel()
                plan[f"{name}.{linears[1]}"] = RowwiseParallel()
    if not plan:
        raise ValueError(f"{type(model).__name__} has no two-Linear MLP to shard")
    return parallelize_module(model, mesh, plan)


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules that get their own FSDP group: the blocks of every ModuleList (a transformer's layers), or
    else the root's children; not one holding a parameter tied elsewhere (it stays with the root's group)."""
    from collections import Counter

    blocks = [m for mod in model.modules() if isinstance(mod, torch.nn.ModuleList) for m in mod]
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    return [u for u in (blocks or list(model.children()))
            if any(p.requires_grad for p in u.parameters())
            and all(uses[id(p)] == 1 for _, p in u.named_parameters(remove_duplicate=False))]


def _shard(model: torch.nn.Module, reshard: bool, mesh) -> torch.nn.Module:
    from torch.distributed.fsdp import fully_shard

    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model


def _full(t):
    """A parameter or gradient as one full tensor on the CPU (a DTensor is gathered: every rank must call)."""
    if t is None:
        return None
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu()


def rank_main(setup: str, name: str, seed: int, steps: int, target_spec: str,
              backend_modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """One rank: train ``steps`` steps under ``setup``; rank 0 returns the gathered gradients and parameters."""
    import torch.distributed as dist

    from conformance.target import resolve_target
    from model_zoo import build
    from model_zoo.built import seed_everything

    from .backends import init_target_group

    target = resolve_target(target_spec, backend_modules=backend_modules)
    init_target_group(target)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        built = build(_config(name, seed, steps))
        model = built.model.to(target.device)
        if setup == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            runner = DistributedDataParallel(model)
        elif setup in ("fsdp2", "fsdp2-keep", "tp"):
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh(target.device.type, (world,))
            runner = _tensor_parallel(model, mesh) if setup == "tp" else _shard(model, setup == "fsdp2", mesh)
        else:
            raise ValueError(f"setup={setup!r} (type=str): expected one of {', '.join(SETUPS)}")
        optimizer = built.optimizer_factory(runner.parameters())
        if setup == "tp":  # sharded (DTensor) and plain parameters: the foreach kernels take one kind at a time
            for group in optimizer.param_groups:
                group["foreach"] = False
        seed_everything(seed)
        losses = []
        data = data_ranks(setup, world)
        for step in range(built.config.steps):
            inputs = _to(built.make_batch(step * data + rank % data), target.device)
            optimizer.zero_grad(set_to_none=True)
            loss = built.loss_fn(runner(**inputs), inputs)
            loss.backward()
            if step < built.config.steps - 1:
                optimizer.step()
            losses.append(float(loss.detach().float().cpu()))
        named = list(model.named_parameters())
        grads = {n: _full(p.grad) for n, p in named if p.grad is not None}
        optimizer.step()
        params = {n: _full(p) for n, p in named}
        target.synchronize()
        devices = sorted({p.device.type for _, p in named})
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return {"losses": losses}
    return {"losses": losses, "grads": grads, "params": params, "devices": devices}


def _to(value, device):
    from diff.sides import to_device

    return to_device(value, device)


def reference_run(setup: str, name: str, seed: int, steps: int, world: int, dtype=None) -> dict[str, Any]:
    """What the ranks compute together, in one CPU process (``dtype`` float64: the golden)."""
    from diff.sides import default_dtype, to_device
    from model_zoo import build
    from model_zoo.built import seed_everything

    built = build(_config(name, seed, steps))
    model = built.model if dtype is None else built.model.to(dtype)
    optimizer = built.optimizer_factory(model.parameters())
    seed_everything(seed)
    losses = []
    world = data_ranks(setup, world)
    with default_dtype(dtype):
        for step in range(built.config.steps):
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for r in range(world):
                inputs = to_device(built.make_batch(step * world + r), "cpu",
                                   {torch.float32: dtype} if dtype is not None else None)
                loss = built.loss_fn(model(**inputs), inputs)
                (loss / world).backward()
                total += float(loss.detach()) / world
            if step < built.config.steps - 1:
                optimizer.step()
            losses.append(total)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def judge_parity(case, ranks: list[dict], target):
    from conformance.outcome import Outcome, Status
    from diff.judge import Judge
    from diff.tolerances import TolerancePolicy

    world = len(ranks)
    steps = int(case.config.get("steps", 0))
    setup = case.config["suite"]
    first = ranks[0]
    if any(d != target.device.type for d in first["devices"]):
        return Outcome(case_id=case.id, status=Status.MISMATCH,
                       message=f"parameters on {', '.join(first['devices'])}, not {target.device.type}")
    data = data_ranks(setup, world)
    losses = [sum(r["losses"][s] for r in ranks[:data]) / data for s in range(len(first["losses"]))]
    actual = {"loss": torch.tensor(losses, dtype=torch.float64), "grads": first["grads"], "params": first["params"]}

    def side(dtype=None):
        run = reference_run(setup, case.name, case.seed, steps, world, dtype)
        return {"loss": torch.tensor(run["losses"], dtype=torch.float64), "grads": run["grads"],
                "params": run["params"]}

    expected = side()
    judge = Judge(tolerance=TolerancePolicy().for_dtype(case.name, scope="model"))
    # The loss is averaged over ranks in float64 on both sides: judged against its float32 golden too.
    verdict = judge(actual, expected, path="parity", golden=lambda: side(torch.float64),
                    reference_again=lambda: side())
    evidence = {"losses": {"reference": [float(x) for x in expected["loss"]], "target": losses},
                "compared": verdict.comparison.leaves, "metrics": verdict.comparison.worst}
    if verdict:
        how = "within the float64 golden band" if verdict.golden_used else "within the model tolerances"
        return Outcome(case_id=case.id, status=Status.PASS, evidence=evidence,
                       message=f"{setup} on {world} ranks: losses, {len(first['grads'])} gradients and "
                               f"{len(first['params'])} parameters match one CPU process ({how})")
    evidence["mismatches"] = [m.to_dict() for m in verdict.comparison.mismatches[:10]]
    return Outcome(case_id=case.id, status=verdict.status, evidence=evidence,
                   message=f"{setup} on {world} ranks: {verdict.message}")
