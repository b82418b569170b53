"""Finds each timm model's tiny defaults and writes ``data/timm_models.json``.

    python -m model_zoo.families.timm_probe [--out PATH] [-j 2] [--only PATTERN ...]

For every name in ``timm.list_models()`` (each a case on the runner's supervisor, see model_zoo/probing.py):

1. build it on the meta device (no memory, no init cost) and count parameters;
2. over ``PARAM_CAP``, scale it down with the depth kwargs its class takes
   (``depth`` -> 2, ``depths``/``layers`` -> one block per stage, then
   fewer heads at the same head width) and keep the first that builds;
3. find the smallest square input from ``SIZES`` for which a batch-2 train
   forward+backward works on meta (on CPU where a model cannot run on meta),
   building fixed-size models with ``img_size=S`` where they accept it; then
   a second, larger size for the size axis, and whether batch 1 trains
   (batch norm refuses one value per channel).

The survey then checks the result for real on CPU.
"""

from __future__ import annotations

import argparse
import fnmatch
import inspect
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import one_line
from .timm_family import DATA, DROP_KWARGS, NUM_CLASSES

PARAM_CAP = 50_000_000
SIZES = (32, 48, 64, 96, 128, 160, 192, 224, 256, 288, 320, 384, 448, 512, 768, 1024)
_META_HINTS = ("meta", "device", "item()", "data-dependent", "NotImplemented", "data_ptr", "storage")


def _create(name: str, kwargs: dict[str, Any], device: str):
    import timm
    import torch

    with torch.device(device):
        return timm.create_model(name, pretrained=False, num_classes=NUM_CLASSES, **kwargs)


def _captured_init_kwargs(name: str, kwargs: dict[str, Any], cls: type) -> dict[str, Any]:
    """The keyword arguments the entrypoint passes to the model class (spied on a meta build)."""
    captured: dict[str, Any] = {}
    original = cls.__init__

    def spy(self, *args, **kw):  # noqa: ANN001 - mirrors any __init__
        if not captured:
            captured.update(kw)
            captured["__positional__"] = len(args)
        return original(self, *args, **kw)

    cls.__init__ = spy
    try:
        _create(name, kwargs, "meta")
    finally:
        cls.__init__ = original
    return captured


def _params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def _scale_down_candidates(init: dict[str, Any]) -> list[dict[str, Any]]:
    depth: dict[str, Any] = {}
    if isinstance(init.get("depth"), int) and init["depth"] > 2:
        depth["depth"] = 2
        for key, value in init.items():  # per-block settings (Sapiens2's kv heads per block) follow the depth
            if isinstance(value, (list, tuple)) and len(value) == init["depth"] and key != "depths":
                depth[key] = type(value)([value[0], value[-1]])
    for key in ("depths", "layers", "stage_depths", "num_blocks"):
        value = init.get(key)
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value) and max(value) > 1:
            depth[key] = type(value)(1 for _ in value)
    out = [depth] if depth else []
    out += [{k: v} for k, v in depth.items()] if len(depth) > 1 else []
    heads, width = init.get("num_heads"), init.get("embed_dim")
    narrow: dict[str, Any] = {}
    if isinstance(heads, int) and isinstance(width, int) and heads >= 4 and width % heads == 0:
        narrow = {"embed_dim": width // heads * (heads // 4), "num_heads": heads // 4}
    elif _int_seq(heads) and (isinstance(width, int) or _int_seq(width)):
        # staged attention (swin-like): a quarter of the heads at the same head width
        narrow = {"num_heads": type(heads)(max(1, h // 4) for h in heads),
                  "embed_dim": width // 4 if isinstance(width, int) else type(width)(w // 4 for w in width)}
    else:
        for key in ("dims", "widths", "embed_dims", "channels"):
            value = init.get(key)
            if _int_seq(value) and all(v % 32 == 0 for v in value):
                narrow = {key: type(value)(v // 4 for v in value)}
                break
    if narrow:
        out += [{**depth, **narrow}] if depth else [narrow]
    return out


def _int_seq(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(v, int) for v in value)


def _train_step(model, batch: int, channels: int, size: int, device: str) -> None:
    import torch

    model.train()
    x = torch.randn(batch, channels, size, size, device=device)
    out = model(x)
    leaves = [out] if isinstance(out, torch.Tensor) else [t for t in (out if isinstance(out, (list, tuple)) else out.values()) if isinstance(t, torch.Tensor)]
    sum(t.float().pow(2).mean() for t in leaves).backward()


def probe(name: str) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = dict(DROP_KWARGS)
    try:
        model = _create(name, kwargs, "meta")
    except TypeError:
        kwargs = {}
        model = _create(name, kwargs, "meta")
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    channels, native = int(cfg.get("input_size", (3, 224, 224))[0]), int(cfg.get("input_size", (3, 224, 224))[-1])
    fixed = bool(cfg.get("fixed_input_size", False))
    cls = type(model)
    init = _captured_init_kwargs(name, kwargs, cls)
    takes_img_size = "img_size" in init or "img_size" in inspect.signature(cls.__init__).parameters
    info: dict[str, Any] = {"native_size": native, "in_chans": channels, "fixed": fixed, "module": cls.__module__,
                            "native_params": _params(model), "shrunk": None,
                            "fused_attn": any(isinstance(getattr(m, "fused_attn", None), bool) for m in model.modules()),
                            "depth_kwarg": "depth" if isinstance(init.get("depth"), int) else None}
    params = info["native_params"]
    if params > PARAM_CAP:
        best = None
        for cand in _scale_down_candidates(init):
            try:
                p = _params(_create(name, {**kwargs, **cand}, "meta"))
            except Exception:  # noqa: BLE001 - this scale-down does not apply to this model
                continue
            if best is None or p < best[0]:
                best = (p, cand)
            if p <= PARAM_CAP:
                break
        if best is not None and best[0] < params:
            params, info["shrunk"] = best[0], best[1]
            kwargs.update(best[1])
    info["params"] = params

    models: dict[tuple, Any] = {}

    def works(size: int, batch: int = 2) -> tuple[bool, str, str]:
        kw = dict(kwargs)
        if fixed and size != native:
            if not takes_img_size:
                return False, "fixed input size", "none"
            kw["img_size"] = size
        reason = ""
        for device in ("meta", "cpu"):
            key = (device, json.dumps(kw, sort_keys=True, default=str), size if device == "meta" else None)
            try:
                if key not in models:
                    models.clear()
                    torch.manual_seed(0)
                    models[key] = _create(name, kw, device)
                _train_step(models[key], batch, channels, size, device)
                return True, "", device
            except Exception as exc:  # noqa: BLE001 - a size the model rejects
                reason = one_line(exc)
                if device == "meta" and not any(h in reason for h in _META_HINTS):
                    return False, reason, device
                if device == "cpu" or params > 4 * PARAM_CAP:
                    return False, reason, device
        return False, reason, "cpu"

    candidates = [s for s in SIZES if s < native] + [native] + [s for s in SIZES if s > native]
    reason, chosen = "", None
    for size in candidates:
        ok, why, where = works(size)
        if ok:
            chosen, info["probe"] = size, where
            break
        reason = reason or why
        if fixed and not takes_img_size:
            break
    if chosen is None:
        info.update(sizes=[native], batches=[2], kwargs=kwargs, error=reason or "no input size works")
        return info
    if fixed and chosen != native:
        kwargs["img_size"] = chosen
    sizes = [chosen]
    for size in [s for s in candidates if s >= 2 * chosen][:3]:
        if works(size)[0]:
            sizes.append(size)
            break
    info["sizes"] = sizes
    info["batches"] = [2, 1] if works(chosen, batch=1)[0] else [2]
    info["kwargs"] = kwargs
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("-j", "--jobs", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None, help="fnmatch patterns of timm names")
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args(argv)
    import timm

    names = timm.list_models()
    if args.only:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in args.only)]
    old = {}
    if args.out.exists():
        try:
            old = json.loads(args.out.read_text())
            old = old.get("models", {}) if old.get("version") == timm.__version__ else {}
        except json.JSONDecodeError:
            old = {}
    models = dict(old)
    start = time.monotonic()
    from ..probing import run_probes

    probes = run_probes("timm-probe", names, jobs=args.jobs, timeout=args.timeout, rss_limit_mb=10 * 1024)
    for i, (name, ok, value, status, reason, seconds) in enumerate(probes, 1):
        models[name] = value if ok else {"sizes": [224], "batches": [2], "kwargs": {}, "error": f"{status}: {reason}"}
        tag = "ok" if ok and not value.get("error") else "FAIL"
        print(f"[{i}/{len(names)}] {name}: {tag} {models[name].get('sizes')} "
              f"{models[name].get('error', '')} ({seconds:.1f}s)", flush=True)
        if i % 100 == 0 or i == len(names):
            _write(args.out, timm.__version__, models)
    _write(args.out, timm.__version__, models)
    print(f"probed {len(names)} models in {time.monotonic() - start:.0f}s", file=sys.stderr)
    return 0


def _write(path: Path, version: str, models: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": version, "param_cap": PARAM_CAP, "models": dict(sorted(models.items()))},
                              indent=1, sort_keys=False))
    tmp.replace(path)


if __name__ == "__main__":
    raise SystemExit(main())
