"""Distributed conformance: collectives, DDP, FSDP2, tensor and pipeline parallelism on the target.

A case of kind ``distributed`` runs N ranks, launched with PyTorch's own
elastic launcher (launch.py), on the target's device and process-group
backend (the emulated device's ``neuron`` backend, ``nccl`` on CUDA, or a
real backend's own), and compares what they compute with the CPU:

- ``collectives`` (collectives.py): each collective, over dtypes and sizes
  across tile boundaries, against the same collective of a gloo group on the
  CPU in the same ranks;
- ``dtensor`` (dtensor.py): redistribution between shard, replicate and
  partial placements (1-D and 2-D meshes) and ops on sharded operands,
  against the same DTensor code on a CPU mesh;
- ``ddp``, ``fsdp2`` (and its variants), ``tp``, ``tp-sp``, ``fsdp2-tp``
  and ``pp`` (parity.py): K training steps of a zoo model, per-step
  losses, gradients and parameters gathered to full tensors, against a
  single-process CPU reference trained on the global batch.

Every verdict comes from the one judge (diff.judge); a rank that hangs is
the case's ``timeout`` (the runner's supervisor), a rank that dies its
``crash``, and the run goes on.
"""
