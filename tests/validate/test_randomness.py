"""Migration verdicts that hold under randomness, on realistic training scripts run unchanged.

Each script draws random numbers on the device (a VAE's ``randn_like``, dropout inside ``nn.Transformer``,
a trainer loop's dropout). The target takes the reference's draws for every deterministic comparison, so a
clean device is READY and a 1-2% fault downstream of a draw is NOT READY with the layer and the op; a
device whose own random stream has the wrong distribution is caught by the distribution check alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.validate.conftest import example

EXACT = ("--emulator-profile", "exact")
SCRIPTS = os.path.join(os.path.dirname(__file__), "scripts")


def test_a_vae_drawing_on_the_device_is_ready_and_takes_the_references_draws(validate):
    run = validate(example("vae.py"), "--steps", "10")
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    (curves,) = run.findings("loss-curves", "info")
    # 11: the 11th step's forward draws before its backward() stops the script
    assert curves["data"]["draws_on_device"] == 11 and "took the reference's 11 random draws" in curves["title"]
    assert run.findings("random-stream", "info"), "the device's own stream is judged as a distribution"
    assert run.report["numerics"]["ok"]


def test_a_fault_downstream_of_a_draw_is_named_by_layer_and_op(validate):
    run = validate(example("vae.py"), "--steps", "10", env={"NEURON_VALIDATE_FAULTS": "perturb@aten::sigmoid,rel=0.02"})
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["culprit"] == "dec.3" and numerics["data"]["op"] == "aten::sigmoid"


def test_a_device_stream_of_the_wrong_distribution_is_caught_by_the_distribution_check(validate):
    """Doubled noise on the device's own stream: the replayed comparison cannot see it (the target took the
    reference's draws), the distribution check of the device's own stream does."""
    run = validate(example("vae.py"), "--steps", "10", env={"NEURON_VALIDATE_FAULTS": "perturb@aten::normal_,rel=1.0"})
    assert run.report["verdict"] == "not ready", run.stdout
    assert run.findings("loss-curves", "info") and run.report["numerics"]["ok"]
    wrong = [f for f in run.findings("random-stream", "error") if f["subject"].startswith("draws:")]
    assert wrong and "aten::randn_like" in wrong[0]["title"] and "variance" in wrong[0]["title"]


def test_nn_transformers_own_dropout_gives_identical_curves_under_exact(validate):
    """word_language_model's case: the CPU drew the weights, the device's generator is elsewhere, yet the
    masks are the reference's: the curves agree bit for bit."""
    run = validate(example("transformer_lm.py"), *EXACT, "--steps", "8")
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert run.report["curves"]["max_abs_gap"] == 0 and run.report["curves"]["steps"] == 8
    assert not run.findings("randomness") and not run.findings(severity="warning")


def test_a_script_drawing_from_its_own_device_generator_is_ready(validate):
    """The script's own generators on the device (torch.Generator(device=...)), seeded again every epoch and
    rewound with set_state: the target takes the reference's numbers through all of it (before, the stand-in
    started again from the seed at every draw: "the sides ask for different random numbers", a warning, and NOT
    READY where the curves then parted), and the draws a correct device repeats with its seed are no evidence
    of another distribution."""
    run = validate(os.path.join(SCRIPTS, "device_generator.py"))
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    assert run.report["randomness"]["parting"] is None and run.report["randomness"]["draw_differences"] == []
    assert set(run.report["randomness"]["ops_on_device"]) >= {"aten::rand", "aten::randn"}
    assert run.findings("random-stream", "info")


def test_a_trainer_loop_counts_optimizer_steps_and_keeps_its_checkpoint_apart(validate):
    run = validate(example("trainer_loop.py"), *EXACT)  # whole: the checkpoint is written at the end
    assert run.returncode == 0 and run.report["verdict"] == "ready", run.stdout
    (curves,) = run.findings("loss-curves", "info")
    assert curves["data"]["steps"] == 12 and curves["data"]["backward_passes"] == 48
    assert "12 steps over 48 backward passes (gradient accumulation)" in curves["title"]
    (created,) = run.findings("outputs", "info")
    assert "checkpoint.pt" in created["title"] and not run.findings("outputs", "warning")
    assert not run.findings("wide-dtypes"), "eager code narrows nothing"
    assert (Path(run.out) / "results.sqlite").exists(), "the store goes with --out"


def test_a_fault_in_a_transformers_model_is_placed_at_transformers_own_line(validate):
    run = validate(example("hf_gpt2.py"), *EXACT, "--steps", "3",
                   env={"NEURON_VALIDATE_FAULTS": "perturb@aten::addmm,rel=0.01"})
    assert run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["op"] == "aten::addmm" and numerics["data"]["culprit"].startswith("transformer.h.0")
    assert "<string>" not in (numerics["where"] or "") and "transformers" in (numerics["where"] or ""), numerics


def test_an_unchanged_script_reads_dot_dot_data_and_each_run_keeps_its_report(tmp_path):
    """pytorch/examples read ``../data`` relative to their folder; the user's shell redirects the output
    into a file there. Neither trips the check, and two runs keep two report folders. The script resumes from
    the user's ``../checkpoints/last.pt``, keeps it as ``prev.pt`` (``os.replace``) and saves there again
    (``torch.save(f=...)``), makes a folder there, removes an older checkpoint, an empty folder and a cache
    folder, and appends to the user's ``logs/train.txt`` beside itself (found from ``__file__``): every run of the check
    resumes from the user's checkpoint, and the user's files are left as they were (before, each run overwrote
    the checkpoint through the mirror's link and the next resumed from it, the removals went through to the
    user's folders, and ``__file__`` named the user's own folder, past the mirror)."""
    import json

    import torch

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "values.txt").write_text(" ".join(str(i % 7) for i in range(64)))
    (tmp_path / "checkpoints").mkdir()
    torch.save({"step": 3}, tmp_path / "checkpoints" / "last.pt")
    (tmp_path / "checkpoints" / "old.pt").write_bytes(b"an older checkpoint")
    (tmp_path / "empty").mkdir()
    (tmp_path / "cache" / "tokens").mkdir(parents=True)
    (tmp_path / "cache" / "tokens" / "0.bin").write_bytes(b"tokens")
    project = tmp_path / "project"
    (project / "logs").mkdir(parents=True)
    (project / "logs" / "train.txt").write_text("the user's own log\n")
    (project / "train.py").write_text(textwrap.dedent("""\
        import os
        import shutil
        import torch
        from torch import nn
        device = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else "cpu"
        values = torch.tensor([float(v) for v in open("../data/values.txt").read().split()]).view(8, 8)
        start = torch.load("../checkpoints/last.pt")["step"] if os.path.exists("../checkpoints/last.pt") else 0
        print("resumed at", start)
        torch.manual_seed(start)
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        here = os.path.dirname(os.path.realpath(__file__))  # the script's folder, found as many scripts find it
        with open(os.path.join(here, "logs", "train.txt"), "a") as log:
            for step in range(start, start + 5):
                loss = model(values.to(device)).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                log.write(f"{step} {loss.item()}\\n")
        os.replace("../checkpoints/last.pt", "../checkpoints/prev.pt")  # keeps the one before
        torch.save({"step": start + 5}, f="../checkpoints/last.pt")
        os.remove("../checkpoints/old.pt")  # keeps the latest two only
        os.makedirs("../checkpoints/best", exist_ok=True)
        os.rmdir("../empty")
        shutil.rmtree("../cache")
        print("done")
        """))
    before = {p: p.read_bytes() for p in (tmp_path / "checkpoints" / "last.pt", tmp_path / "checkpoints" / "old.pt",
                                          tmp_path / "cache" / "tokens" / "0.bin", project / "logs" / "train.txt")}
    exe = os.path.join(os.path.dirname(sys.executable), "neuron-validate")
    env = {**os.environ, "NEURON_VALIDATE_EMULATOR_PROFILE": "exact"}
    for _ in range(2):
        result = subprocess.run(f"'{exe}' train.py --json > log.txt 2> err.txt", shell=True, cwd=project, env=env,
                                timeout=600)
        assert result.returncode == 0, (project / "err.txt").read_text()
    assert {p: p.read_bytes() for p in before} == before, "the check wrote into the user's files"
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["last.pt", "old.pt"], "entries made or renamed there"
    assert (tmp_path / "empty").is_dir(), "the user's empty folder was removed"

    report = json.loads((project / "log.txt").read_text())
    assert report["verdict"] == "ready", report["findings"]
    outputs = [f for f in report["findings"] if f["check"] == "outputs"]
    assert not [f for f in outputs if f["severity"] == "warning"], outputs
    assert not [f for f in outputs if "train.py" in f["title"]], "the script's copy it ran from is not an output"
    runs = project / "runs" / "validate" / "train"
    folders = sorted(p.name for p in runs.iterdir() if not p.is_symlink())
    assert len(folders) == 2 and (runs / "latest").resolve().name == folders[-1]
    assert (runs / "latest" / "report.json").exists() and (project / "runs" / "results.sqlite").exists()
    printed = {p.parent.name: p.read_text() for p in (runs / "latest" / "work").glob("*/stdout.txt")}
    assert {"reference", "target"} <= set(printed)
    assert all(out.startswith("resumed at 3\n") for out in printed.values()), printed


def test_a_random_kernel_that_raises_on_the_device_is_the_targets_failure(validate):
    """The compared training took the reference's draws on the CPU, so the device's random kernels run only
    in the training on its own stream: one that raises there is a finding against the target."""
    run = validate(example("vae.py"), *EXACT, "--steps", "3", env={"NEURON_VALIDATE_FAULTS": "raise@aten::normal_"})
    assert run.report["verdict"] == "not ready", run.stdout
    (fails,) = [f for f in run.findings("random-stream", "error") if f["subject"] == "fails"]
    assert "injected fault" in fails["title"] and not run.findings("harness")


def test_every_side_draws_the_same_unseeded_python_numpy_and_torch_numbers_and_the_seed_changes_them(tmp_path):
    """A script that draws from Python's, NumPy's or torch's global generators without seeding them (DCGAN
    draws its torch seed from ``random.randint``; torch 2.14 seeds its generator from the OS at import, so
    imagenet's unseeded resnet started from other weights on each side) sees the same numbers on every side
    of a check, or the sides would compare other weights and other batches. Sides fork from zygotes, which
    reseed Python's and NumPy's from the OS at each fork (runner/zygote.py); the check's ``--seed`` then
    decides, and another seed gives other numbers."""
    from conformance.case import Case
    from conformance.outcome import Status
    from conformance.settings import RunSettings
    from runner.supervisor import Job, Supervisor
    from validate.common import ChildSpec
    from validate.run import CPU_SIDE_ENV

    script = tmp_path / "draws.py"
    script.write_text(textwrap.dedent("""\
        import random
        import numpy
        import torch
        unseeded = torch.rand(()).item()
        torch.manual_seed(random.randint(1, 10000))
        print("draws", unseeded, random.random(), numpy.random.rand(), torch.rand(()).item())
        model = torch.nn.Linear(4, 1)
        loss = model(torch.ones(2, 4)).sum()
        loss.backward()
        """))
    jobs = []  # the target's side forks from another zygote than the CPU's (another environment)
    for label, side, seed in (("reference", "reference", 0), ("target", "target", 0), ("seed-1", "reference", 1)):
        spec = ChildSpec(script=str(script), convention="training", side=side, target="neuron",
                         reference="cpu", out=str(tmp_path / label), seed=seed, localize=False)
        jobs.append(Job(case=Case(kind="script-side", name=str(script), mode=label, config=spec.to_config()),
                        env=CPU_SIDE_ENV if side == "reference" else {}))
    with Supervisor(RunSettings(target="neuron", timeout_s=300), jobs=2, fresh=True) as supervisor:
        outcomes = [outcome for _, outcome in supervisor.run_jobs(jobs)]
    assert all(o.status is Status.PASS for o in outcomes), [o.message for o in outcomes]
    draws = [next(line for line in (tmp_path / label / "stdout.txt").read_text().splitlines()
                  if line.startswith("draws")) for label in ("reference", "target", "seed-1")]
    assert draws[0] == draws[1] != draws[2], draws


def test_attention_without_dropout_is_the_devices_own_and_a_fault_in_it_is_found(validate):
    """PyTorch tags every attention kernel random, for its dropout. Called with ``dropout_p=0`` it draws
    nothing: it must run on the device and be judged, not be taken from the CPU as a draw (a device attention
    5% off was READY before)."""
    script = os.path.join(os.path.dirname(__file__), "scripts", "attention_training.py")  # no dropout
    fault = "perturb@aten::_scaled_dot_product_flash_attention_for_cpu,rel=0.05"
    run = validate(script, *EXACT, env={"NEURON_VALIDATE_FAULTS": fault})
    assert run.returncode == 1 and run.report["verdict"] == "not ready", run.stdout
    (numerics,) = run.findings("numerics", "error")
    assert numerics["data"]["op"] == "aten::_scaled_dot_product_flash_attention_for_cpu", numerics
    clean = validate(script, *EXACT)
    assert clean.returncode == 0 and clean.report["verdict"] == "ready", clean.stdout
    assert clean.report["randomness"]["on_device"] == 0 and not clean.findings("random-stream")
