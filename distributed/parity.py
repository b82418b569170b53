"""Parallelism parity: a zoo model trained K steps on N ranks of the target against one CPU process.

Every rank builds the same zoo configuration (same seed, so the same initial
weights) and trains it with the zoo's optimizer; a data-parallel rank ``r``
takes batch ``make_batch(step * D + r)`` at each step (D data-parallel
ranks). The setups (:data:`SETUPS`):

- ``ddp``: ``DistributedDataParallel`` (gradients averaged by all-reduce);
- ``fsdp2``: ``fully_shard`` on every block (:func:`shard_units`), then the
  root; ``fsdp2-keep`` with ``reshard_after_forward=False``; ``fsdp2-mp``
  with a ``MixedPrecisionPolicy`` (bfloat16 parameters, float32 reduction);
- ``tp``: ``ColwiseParallel`` then ``RowwiseParallel`` on every block's MLP
  of a tiny transformer; ``tp-sp`` adds ``SequenceParallel`` norms on a
  sequence-sharded residual stream (torchtitan's layout);
- ``fsdp2-tp``: 2-D, tensor parallelism within pairs of ranks of a device
  mesh and ``fully_shard`` across the pairs (4 ranks and more);
- ``pp``: ``torch.distributed.pipelining``, one stage per rank
  (stages.py), a GPipe schedule of 2 microbatches.

The reference is one CPU process doing what the ranks do together: each
step, the gradient of every data-parallel rank's batch, averaged, then one
optimizer step (under mixed precision through a bfloat16 copy of the
parameters, averaged in float32). Per-step losses (the mean over ranks), the
last step's gradients and the parameters after K steps, gathered to full
tensors on rank 0, go through the one judge with the model tolerances; its
float64 golden (the same reference in float64) absorbs the different order
in which the ranks' gradients are summed and, under mixed precision, the
bfloat16 rounding both sides share, so a correct backend passes bit for bit
or within that band.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

MODELS = ("hf/gpt2:causal_lm", "world/rssm")  # the tiny GPT and the world model
TRANSFORMERS = ("flex/causal_lm",)  # a tiny transformer of nn.Linear layers (tensor parallelism shards those)
DEFAULT_STEPS = 3
MICROBATCHES = 2  # of the pipelining schedule


@dataclass(frozen=True, slots=True, kw_only=True)
class Setup:
    """A way of training on N ranks, and what the single CPU process does to match it."""

    name: str
    doc: str
    models: tuple[str, ...]
    tp: int = 1  # ranks that share each batch (the tensor-parallel group's size); 0: all of them
    min_world: int = 2
    mixed_precision: bool = False  # FSDP2's MixedPrecisionPolicy: parameters in bfloat16, gradients reduced in float32

    def data_ranks(self, world: int) -> int:
        """How many different batches a step takes: one per data-parallel rank."""
        return 1 if self.tp == 0 else world // self.tp

    def batch_index(self, rank: int, world: int) -> int:
        return rank // (world // self.data_ranks(world))

    def unfit(self, world: int) -> str:
        """Why ``world`` ranks cannot run this setup ("" when they can)."""
        if world < self.min_world:
            return f"{self.name} needs at least {self.min_world} ranks"
        if self.tp > 1 and world % self.tp:
            return f"{self.name} needs a multiple of {self.tp} ranks"
        return ""


SETUPS = {s.name: s for s in (
    Setup(name="ddp", doc="DistributedDataParallel: gradients averaged by all-reduce", models=MODELS),
    Setup(name="fsdp2", doc="fully_shard on every block and the root", models=MODELS),
    Setup(name="fsdp2-keep", doc="fully_shard with reshard_after_forward=False", models=MODELS),
    Setup(name="fsdp2-mp", doc="fully_shard with MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)",
          models=MODELS, mixed_precision=True),
    Setup(name="tp", doc="ColwiseParallel then RowwiseParallel on every MLP", models=TRANSFORMERS, tp=0),
    Setup(name="tp-sp", doc="tensor parallelism with SequenceParallel norms and a sequence-sharded residual stream",
          models=TRANSFORMERS, tp=0),
    Setup(name="fsdp2-tp", doc="2-D: tensor parallelism within pairs of ranks, fully_shard across them",
          models=TRANSFORMERS, tp=2, min_world=4),
    Setup(name="pp", doc="torch.distributed.pipelining: one stage per rank, GPipe schedule of 2 microbatches",
          models=TRANSFORMERS, tp=0),
)}


def setup_named(name: str) -> Setup:
    try:
        return SETUPS[name]
    except KeyError:
        raise ValueError(f"setup={name!r} (type=str): expected one of {', '.join(SETUPS)}") from None


def _config(name: str, seed: int, steps: int, setup: Setup, world: int):
    from model_zoo import ModelConfig

    attn = "sdpa" if name.startswith("flex/") else "default"  # FlexAttention has no CPU backward
    layers = max(2, world) if setup.name == "pp" else None  # a block per stage at least
    return ModelConfig(arch=name, mode="steps", steps=steps or DEFAULT_STEPS, seed=seed, attn=attn, layers=layers)


def _mlp_plan(model: torch.nn.Module, sequence_parallel: bool = False) -> dict[str, Any]:
    """Megatron-style MLP sharding of every block: the first Linear by columns, the second by rows (with
    sequence parallelism their input is gathered from, and their output scattered to, sequence shards)."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, Any] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Sequential):
            linears = [n for n, m in module.named_children() if isinstance(m, torch.nn.Linear)]
            if len(linears) == 2:
                if sequence_parallel:
                    plan[f"{name}.{linears[0]}"] = ColwiseParallel(input_layouts=Shard(1))
                    plan[f"{name}.{linears[1]}"] = RowwiseParallel(output_layouts=Shard(1), use_local_output=False)
                else:
                    plan[f"{name}.{linears[0]}"] = ColwiseParallel()
                    plan[f"{name}.{linears[1]}"] = RowwiseParallel()
    if not plan:
        raise ValueError(f"{type(model).__name__} has no two-Linear MLP to shard")
    return plan


def _sequence_parallel_plan(model: torch.nn.Module) -> dict[str, Any]:
    """torchtitan's layout on a flex transformer: the residual stream between the blocks is sharded along the
    sequence (a DTensor), the blocks' LayerNorms run SequenceParallel on the shards, attention (not sharded)
    gathers the sequence and scatters its output back, the MLPs go column- then row-wise, and the final norm
    gathers the sequence for the tied head."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput, SequenceParallel

    if not all(hasattr(model, a) for a in ("blocks", "norm")):
        raise ValueError(f"{type(model).__name__} has no blocks and final norm for sequence parallelism")
    plan = _mlp_plan(model, sequence_parallel=True)
    plan["blocks.0"] = PrepareModuleInput(input_layouts=(Replicate(), None), desired_input_layouts=(Shard(1), None),
                                          use_local_output=False)
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}.norm1"] = SequenceParallel()
        plan[f"blocks.{i}.norm2"] = SequenceParallel()
        plan[f"blocks.{i}.attn"] = PrepareModuleInput(input_layouts=(Shard(1), None),
                                                      desired_input_layouts=(Replicate(), None), use_local_output=True)
        plan[f"blocks.{i}.attn.out"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(1),
                                                           use_local_output=False)
    plan["norm"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                      use_local_output=True)  # the tied head takes the whole sequence
    return plan


def _tensor_parallel(model: torch.nn.Module, mesh, sequence_parallel: bool = False) -> torch.nn.Module:
    from torch.distributed.tensor.parallel import parallelize_module

    plan = _sequence_parallel_plan(model) if sequence_parallel else _mlp_plan(model)
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


def _shard(model: torch.nn.Module, mesh, *, reshard: bool = True, mixed_precision: bool = False) -> torch.nn.Module:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if mixed_precision \
        else MixedPrecisionPolicy()
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=policy)
    return model


def _full(t):
    """A parameter or gradient as one full tensor on the CPU (a DTensor is gathered: every rank must call)."""
    if t is None:
        return None
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach().cpu()


def rank_main(setup_name: str, name: str, seed: int, steps: int, target_spec: str,
              backend_modules: tuple[str, ...] = ()) -> dict[str, Any]:
    """One rank: train ``steps`` steps under the setup; rank 0 returns the gathered gradients and parameters."""
    import torch.distributed as dist

    from conformance.target import resolve_target
    from model_zoo import build

    from .backends import init_target_group

    setup = setup_named(setup_name)
    target = resolve_target(target_spec, backend_modules=backend_modules)
    init_target_group(target)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        built = build(_config(name, seed, steps, setup, world))
        model = built.model.to(target.device)
        if setup.name == "pp":
            trained = _pipeline_steps(built, model, target, seed)
        else:
            trained = _steps(setup, built, _parallelize(setup, model, target.device.type, world), model, target, seed)
        target.synchronize()
    finally:
        dist.destroy_process_group()
    return trained if rank == 0 else {"losses": trained["losses"]}


def _parallelize(setup: Setup, model: torch.nn.Module, device_type: str, world: int) -> torch.nn.Module:
    from torch.distributed.device_mesh import init_device_mesh

    if setup.name == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model)
    if setup.name == "fsdp2-tp":
        mesh = init_device_mesh(device_type, (world // setup.tp, setup.tp), mesh_dim_names=("dp", "tp"))
        return _shard(_tensor_parallel(model, mesh["tp"]), mesh["dp"])
    mesh = init_device_mesh(device_type, (world,))
    if setup.name in ("tp", "tp-sp"):
        return _tensor_parallel(model, mesh, sequence_parallel=setup.name == "tp-sp")
    return _shard(model, mesh, reshard=setup.name != "fsdp2-keep", mixed_precision=setup.mixed_precision)


def _steps(setup: Setup, built, runner: torch.nn.Module, model: torch.nn.Module, target, seed: int) -> dict[str, Any]:
    """K steps of the zoo's optimizer on this rank's batches; the last step's gradients, then its parameters."""
    import torch.distributed as dist

    from model_zoo.built import seed_everything

    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer = built.optimizer_factory(runner.parameters())
    if setup.tp != 1:  # sharded (DTensor) and plain parameters: the foreach kernels take one kind at a time
        for group in optimizer.param_groups:
            group["foreach"] = False
    seed_everything(seed)
    losses = []
    data, index = setup.data_ranks(world), setup.batch_index(rank, world)
    for step in range(built.config.steps):
        inputs = _to(built.make_batch(step * data + index), target.device)
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
    return {"losses": losses, "grads": grads, "params": params, "devices": sorted({p.device.type for _, p in named})}


def _pipeline_steps(built, model: torch.nn.Module, target, seed: int) -> dict[str, Any]:
    """K steps of a GPipe schedule, one stage per rank; every rank's stage parameters come to rank 0."""
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from model_zoo.built import seed_everything

    from .stages import next_token_loss, split_stages, tie_gradients

    rank, world = dist.get_rank(), dist.get_world_size()
    stage_module = split_stages(model, world)[rank]
    tied = dist.new_group([0, world - 1])  # every rank creates every group
    plumbing = dist.new_group(backend="gloo")  # the harness's own traffic: not through the target's collectives
    stage = PipelineStage(stage_module, rank, world, target.device)
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=next_token_loss)
    optimizer = built.optimizer_factory(stage_module.parameters())
    seed_everything(seed)
    losses = []
    names = {id(p): n for n, p in model.named_parameters()}
    owned = [(names[id(p)], p) for p in stage_module.parameters()]
    for step in range(built.config.steps):
        ids = _to(built.make_batch(step)["input_ids"], target.device)
        optimizer.zero_grad(set_to_none=True)
        microbatch_losses: list[torch.Tensor] = []
        if rank == 0:
            schedule.step(ids)
        elif rank == world - 1:
            schedule.step(target=ids, losses=microbatch_losses)
        else:
            schedule.step()
        tie_gradients(model, rank, world, tied)
        if step < built.config.steps - 1:
            optimizer.step()
        step_loss = [float(torch.stack([x.detach().float().cpu() for x in microbatch_losses]).mean())
                     if microbatch_losses else 0.0]
        dist.broadcast_object_list(step_loss, src=world - 1, group=plumbing)
        losses.append(step_loss[0])
    grads = {n: p.grad.detach().cpu() for n, p in owned if p.grad is not None}
    optimizer.step()
    params = {n: p.detach().cpu() for n, p in owned}
    devices = sorted({p.device.type for _, p in owned})
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, {"grads": grads, "params": params, "devices": devices}, group=plumbing)
    merged: dict[str, Any] = {"losses": losses, "grads": {}, "params": {}, "devices": set()}
    for part in gathered:
        merged["grads"].update(part["grads"])
        merged["params"].update(part["params"])
        merged["devices"].update(part["devices"])
    merged["devices"] = sorted(merged["devices"])
    return merged


def _to(value, device):
    from diff.sides import to_device

    return to_device(value, device)


def reference_run(setup_name: str, name: str, seed: int, steps: int, world: int, dtype=None) -> dict[str, Any]:
    """What the ranks compute together, in one CPU process (``dtype`` float64: the golden, in full precision
    even where the setup computes in bfloat16).

    Each step takes the gradient of every data-parallel rank's batch and averages them, then one optimizer
    step; under mixed precision each batch's gradient is computed by a bfloat16 copy of the parameters and
    averaged in float32, as FSDP2's policy does, and the float32 parameters take the step.
    """
    from diff.sides import default_dtype, to_device
    from model_zoo import build
    from model_zoo.built import seed_everything

    setup = setup_named(setup_name)
    built = build(_config(name, seed, steps, setup, world))
    model = built.model if dtype is None else built.model.to(dtype)
    compute_dtype = torch.bfloat16 if setup.mixed_precision and dtype is None else None
    optimizer = built.optimizer_factory(model.parameters())
    seed_everything(seed)
    losses = []
    data = setup.data_ranks(world)
    cast = {torch.float32: dtype} if dtype is not None else ({torch.float32: compute_dtype} if compute_dtype else None)
    # Batches are drawn before float64 becomes the default dtype: a float64 draw is different numbers.
    batches = [to_device(built.make_batch(i), "cpu", cast) for i in range(built.config.steps * data)]
    with default_dtype(dtype):
        for step in range(built.config.steps):
            optimizer.zero_grad(set_to_none=True)
            total = 0.0
            for r in range(data):
                inputs = batches[step * data + r]
                if compute_dtype is None:
                    loss = built.loss_fn(model(**inputs), inputs)
                    (loss / data).backward()
                else:
                    loss = _low_precision_backward(model, built.loss_fn, inputs, compute_dtype, data)
                total += float(loss.detach()) / data
            if step < built.config.steps - 1:
                optimizer.step()
            losses.append(total)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        optimizer.step()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return {"losses": losses, "grads": grads, "params": params}


def _low_precision_backward(model: torch.nn.Module, loss_fn, inputs, compute_dtype: torch.dtype, data: int):
    """One batch's loss and gradient through a copy of the model whose parameters are in ``compute_dtype``; the
    gradient, in float32 and divided by the data-parallel ranks, is added to the float32 parameters'."""
    import copy

    low = copy.deepcopy(model)
    for p in low.parameters():
        p.data = p.data.to(compute_dtype)
        p.grad = None
    loss = loss_fn(low(**inputs), inputs)
    loss.backward()
    for p, q in zip(model.parameters(), low.parameters()):
        if q.grad is not None:
            g = q.grad.float() / data
            p.grad = g if p.grad is None else p.grad + g
    return loss


def judge_parity(case, ranks: list[dict], target):
    from conformance.outcome import Outcome, Status
    from diff.judge import Judge
    from diff.precision import model_for, perturbed_runs
    from diff.tolerances import TolerancePolicy

    world = len(ranks)
    steps = int(case.config.get("steps", 0))
    setup = case.config["suite"]
    first = ranks[0]
    if any(d != target.device.type for d in first["devices"]):
        return Outcome(case_id=case.id, status=Status.MISMATCH,
                       message=f"parameters on {', '.join(first['devices'])}, not {target.device.type}")
    # Ranks that share a batch (tensor parallelism, pipeline stages) report the same loss: the mean over all
    # ranks is the mean over the data-parallel ones.
    losses = [sum(r["losses"][s] for r in ranks) / world for s in range(len(first["losses"]))]
    actual = {"loss": torch.tensor(losses, dtype=torch.float64), "grads": first["grads"], "params": first["params"]}

    def side(dtype=None):
        run = reference_run(setup, case.name, case.seed, steps, world, dtype)
        return {"loss": torch.tensor(run["losses"], dtype=torch.float64), "grads": run["grads"],
                "params": run["params"]}

    expected = side()
    precision = model_for(target)
    judge = Judge(tolerance=TolerancePolicy().for_dtype(case.name, scope="model"), precision=precision)
    # The loss is averaged over ranks in float64 on both sides: judged against its float32 golden too. A target
    # with a precision model is judged against the spread of the reference run with its ops perturbed too.
    verdict = judge(actual, expected, path="parity", golden=lambda: side(torch.float64),
                    reference_again=lambda: side(),
                    noise=(lambda: perturbed_runs(side, precision, seed=case.seed)) if precision else None)
    evidence = {"losses": {"reference": [float(x) for x in expected["loss"]], "target": losses},
                "compared": verdict.comparison.leaves, "metrics": verdict.comparison.worst}
    if verdict.noise is not None:
        evidence["noise_floor"] = verdict.noise.to_dict()
    if verdict:
        how = ("within device precision" if verdict.within_precision else
               "within the float64 golden band" if verdict.golden_used else "within the model tolerances")
        return Outcome(case_id=case.id, status=Status.PASS, evidence=evidence,
                       message=f"{setup} on {world} ranks: losses, {len(first['grads'])} gradients and "
                               f"{len(first['params'])} parameters match one CPU process ({how})")
    evidence["mismatches"] = [m.to_dict() for m in verdict.comparison.mismatches[:10]]
    return Outcome(case_id=case.id, status=verdict.status, evidence=evidence,
                   message=f"{setup} on {world} ranks: {verdict.message}")
