"""Overhead of the emulated neuron device (``exact``) over plain CPU eager.

Forward plus backward of a tiny GPT and of resnet18 at 64x64, median of N
runs each, the two devices interleaved in one process so that both see the
same machine state. Goal: a ratio of 1.5x at most.

    python bench/emulator_overhead.py [--runs 9]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

os.environ["NEURON_VALIDATE_EMULATOR_PROFILE"] = "exact"

import torch  # noqa: E402


def tiny_gpt():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config)
    ids = torch.randint(0, 128, (4, 32))
    return model, {"input_ids": ids, "labels": ids}, lambda out: out.loss


def resnet18():
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnet18", pretrained=False, num_classes=10)
    return model, {"x": torch.randn(4, 3, 64, 64)}, lambda out: out.float().square().mean()


def measure(build, runs: int) -> tuple[float, float]:
    model, inputs, loss_of = build()
    sides = {}
    for device in ("cpu", "neuron"):
        m = copy.deepcopy(model).to(device)
        kwargs = {k: v.to(device) for k, v in inputs.items()}
        sides[device] = (m, kwargs)

    def once(device):
        m, kwargs = sides[device]
        start = time.perf_counter()
        out = m(**kwargs) if "x" not in kwargs else m(kwargs["x"])
        loss_of(out).backward()
        if device != "cpu":
            torch.accelerator.synchronize()
        return time.perf_counter() - start

    for device in sides:  # warm-up
        once(device)
    times = {"cpu": [], "neuron": []}
    for _ in range(runs):
        for device in ("cpu", "neuron"):
            times[device].append(once(device))
    return statistics.median(times["cpu"]), statistics.median(times["neuron"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9)
    args = parser.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.runs} runs, profile exact")
    print(f"{'model':<22}{'cpu eager (ms)':>16}{'emulated (ms)':>16}{'ratio':>8}")
    for name, build in (("tiny GPT (fwd+bwd)", tiny_gpt), ("resnet18 64x64 (fwd+bwd)", resnet18)):
        cpu, emulated = measure(build, args.runs)
        print(f"{name:<22}{cpu * 1e3:>16.2f}{emulated * 1e3:>16.2f}{emulated / cpu:>7.2f}x")
    print("goal: 1.50x at most")


if __name__ == "__main__":
    main()
