"""Bad input gets one line naming the problem and exit code 2, never a traceback (unless --verbose)."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli
from tests.validate.conftest import example

FUNCTIONS_HEAD = "import torch\nimport torch.nn as nn\n"

# name -> (script text or None, extra arguments, environment, expected text in the error line)
CASES = {
    "syntax error": ("import torch\ndef get_model(:\n    pass\n", [], {}, "script.py:2: syntax error"),
    "import error": ("import torch\nimport not_a_real_module\nmodel = torch.nn.Linear(2, 2)\n", [], {},
                     "the script fails to import: ModuleNotFoundError: No module named 'not_a_real_module'"),
    "import error, functions": (FUNCTIONS_HEAD + "import no_such_pkg\ndef get_model(): return nn.Linear(2, 2)\n"
                                "def get_inputs(): return torch.randn(1, 2)\n", [], {},
                                "the script fails to import: ModuleNotFoundError"),
    "no get_inputs": (FUNCTIONS_HEAD + "def get_model(): return nn.Linear(2, 2)\n", [], {},
                      "defines get_model() but no get_inputs()"),
    "get_model raises": (FUNCTIONS_HEAD + "def get_model(): raise ValueError('no weights here')\n"
                         "def get_inputs(): return torch.randn(1, 2)\n", [], {},
                         "get_model() raised: ValueError: no weights here (script.py:3 in get_model)"),
    "not a module": (FUNCTIONS_HEAD + "def get_model(): return 42\ndef get_inputs(): return torch.randn(1, 2)\n",
                     [], {}, "get_model() is a int, expected a torch.nn.Module"),
    "model raises on the reference": (
        FUNCTIONS_HEAD + "class M(nn.Module):\n    def forward(self, x):\n        raise RuntimeError('broken forward')\n"
        "def get_model(): return M()\ndef get_inputs(): return torch.randn(1, 2)\n", [], {},
        "the model raised on the reference (cpu): RuntimeError: broken forward at script.py:5 in forward"),
    "inputs of the wrong shape": (
        FUNCTIONS_HEAD + "def get_model(): return nn.Sequential(nn.Linear(8, 4), nn.ReLU())\n"
        "def get_inputs(): return (torch.randn(3, 5),)\n", [], {},
        "do the inputs from get_inputs() have the shapes the model expects?"),
    "inputs are a string": (FUNCTIONS_HEAD + "model = nn.Linear(2, 2)\nexample_inputs = 'cat.jpg'\n", [], {},
                            "inputs are a str"),
    "no model found": ("import torch\nx = torch.ones(3) * 2\nprint(x.sum())\n", [], {},
                       "no model found: the script defines no get_model() and get_inputs() (or model and "
                       "example_inputs), and running it called no torch.nn.Module with parameters; its last output "
                       "on the reference: 'tensor(6.)'"),
    "model called only inside torch.func transforms": (  # PyTorch's neural tangent kernel tutorial
        "import torch\nfrom torch.func import functional_call, jacrev, vmap\n"
        "net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))\n"
        "params = {k: v.detach() for k, v in net.named_parameters()}\n"
        "one = lambda p, x: functional_call(net, p, (x.unsqueeze(0),)).squeeze(0)\n"
        "print(vmap(jacrev(one), (None, 0))(params, torch.randn(5, 4))['0.weight'].shape)\n", [], {},
        "no model to compare: the script calls its model (Sequential) only inside torch.func transforms"),
    "training script fails on the reference": (
        "import torch\nmodel = torch.nn.Linear(2, 2)\nloss = model(torch.ones(1, 2)).sum()\nprint(1 / 0)\n", [], {},
        "the script fails on the reference (cpu): ZeroDivisionError: division by zero (script.py:4 in <module>)"),
    "a generator made on the named neuron device": (
        "import torch\ng = torch.Generator(device='neuron')\nmodel = torch.nn.Linear(2, 2).to('neuron')\n"
        "model(torch.rand(1, 2, device='neuron', generator=g)).sum().backward()\n",
        [], {}, "has no CPU counterpart (a generator or a stream made on the device)"),
    "exits with a status": ("import sys, torch\nm = torch.nn.Linear(2, 2)\nm(torch.ones(1, 2))\nsys.exit(3)\n", [], {},
                            "the script exited with status 3"),
    "never calls backward with --steps": (
        "import torch\nmodel = torch.nn.Linear(2, 2)\nwith torch.no_grad():\n    model(torch.ones(1, 2))\n",
        ["--steps", "5"], {}, "--steps 5: the script never called backward()"),
    "trains only in processes of its own": (  # pytorch/examples' mnist_hogwild
        "import torch, torch.multiprocessing as mp\ndef train(model):\n    model(torch.ones(1, 2)).sum().backward()\n"
        "if __name__ == '__main__':\n    model = torch.nn.Linear(2, 2)\n    model.share_memory()\n"
        "    workers = [mp.Process(target=train, args=(model,)) for _ in range(2)]\n"
        "    [w.start() for w in workers]\n    [w.join() for w in workers]\n"
        "    loader = torch.utils.data.DataLoader(range(4), num_workers=1)  # a loader's workers are not counted\n"
        "    with torch.no_grad():\n        model(torch.ones(1, 2) * sum(b.sum() for b in loader))\n",
        ["--steps", "5"], {}, "--steps 5: the script never called backward(), so there is no loss curve to compare; "
        "it started 2 processes of its own (multiprocessing), where it may train"),
    "non-scalar loss with --steps": (
        FUNCTIONS_HEAD + "def get_model(): return nn.Linear(2, 3)\ndef get_inputs(): return torch.randn(4, 2)\n"
        "def loss_fn(out): return out\n", ["--steps", "5"], {},
        "--steps 5: no loss curve can be trained: loss_fn(output) returned a tensor of shape (4, 3), expected a scalar"),
    "unknown target": ("x = 1\n", ["--target", "tpu"], {}, "unknown target 'tpu'"),
    "unknown mode in the target": ("x = 1\n", ["--target", "neuron:jit"], {}, "unknown mode 'jit'"),
    "target and mode disagree": ("x = 1\n", ["--target", "neuron:compile", "--mode", "eager"], {}, "disagree"),
    "unknown --mode": ("x = 1\n", ["--mode", "lazy"], {}, "argument --mode: invalid choice: 'lazy'"),
    "bad emulator profile": ("x = 1\n", ["--emulator-profile", "neuron-9"], {}, "unknown emulator profile 'neuron-9'"),
    "negative steps": ("x = 1\n", ["--steps", "-3"], {}, "--steps -3: must be 0 or more"),
    "steps not a number": ("x = 1\n", ["--steps", "many"], {}, "argument --steps: invalid int value: 'many'"),
    "bad fault spec": ("x = 1\n", [], {"NEURON_VALIDATE_FAULTS": "perturb@aten::add,rel=lots"}, "expected a number"),
    "not a python file": (None, ["NOTES.txt"], {}, "expected a Python script ending in .py"),
    "missing file": (None, ["missing.py"], {}, "missing.py: no such file"),
}


SUBPROCESS = {"unknown target", "bad fault spec", "missing file", "syntax error"}  # through the console script


def _validate(args, tmp_path, env, capsys, monkeypatch, *, subprocess: bool):
    """(exit code, stderr) of neuron-validate run in tmp_path: as a command, or in this process (faster)."""
    if subprocess:
        result = run_cli("neuron-validate", *args, env=env, cwd=str(tmp_path), timeout=300)
        return result.returncode, result.stderr
    from cli.validate import main

    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code = main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_exit_code_2(name, tmp_path, capsys, monkeypatch):
    text, extra, env, expected = CASES[name]
    (tmp_path / "NOTES.txt").write_text("not python")
    if text is not None:
        (tmp_path / "script.py").write_text(text)
        args = ["script.py", *extra]
    else:
        args = extra
    try:
        code, stderr = _validate([*args, "--out", str(tmp_path / "out")], tmp_path, env, capsys, monkeypatch,
                                 subprocess=name in SUBPROCESS)
    except SystemExit as exc:  # argparse's own errors exit from parse_args
        code, stderr = exc.code, capsys.readouterr().err
    assert code == 2, stderr
    lines = [line for line in stderr.splitlines() if line.strip() and not line.startswith(("neuron-validate ", "  "))]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("neuron-validate: error:"), lines[0]
    assert expected in lines[0], lines[0]
    assert "Traceback" not in stderr


def test_output_folder_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("")
    result = run_cli("neuron-validate", example("vision_classifier.py"), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "is a file; expected a folder" in result.stderr


def test_no_arguments_is_a_usage_error():
    result = run_cli("neuron-validate")
    assert result.returncode == 2 and "the following arguments are required: script" in result.stderr


def test_verbose_shows_the_traceback(tmp_path):
    (tmp_path / "script.py").write_text(FUNCTIONS_HEAD + "def get_model(): return nn.Linear(2, 2)\n")
    result = run_cli("neuron-validate", "script.py", "--verbose", cwd=str(tmp_path))
    assert result.returncode == 2 and "Traceback" in result.stderr


@pytest.mark.parametrize("content, expected", [
    (None, "no such file"),
    ("{not json", "not JSON"),
    (json.dumps({"schema": "something/else"}), "not a neuron-validate report"),
])
def test_compare_rejects_what_is_not_a_report(tmp_path, content, expected, capsys):
    old = tmp_path / "old.json"
    if content is not None:
        old.write_text(content)
    from cli.validate import main

    assert main(["compare", str(old), str(old)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
