"""The migration checks: findings from the observations the child processes made.

Each ``check_*`` function reads one part of the observations and returns its
findings; :func:`run_checks` runs them all in a fixed order. Keeping them
pure (observations in, findings out) lets a report be rebuilt from its JSON
and two reports be compared without running anything again.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from diff.curves import CurveComparison, CurveTolerance, LossCurve, compare_curves, json_float
from diff.precision import SPREAD_MULTIPLE

from .explain import explain
from .verdict import Finding


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckContext:
    target: str  # e.g. "neuron (emulated) (torch.compile)"
    reference: str
    device: str  # device type of the target, e.g. "neuron"
    mode: str
    emulated: bool
    curve_tolerance: CurveTolerance = CurveTolerance()


def _where(source: dict | None) -> str | None:
    return source.get("text") if source else None


# ---------------------------------------------------------------- runs
def check_runs(obs: dict, ctx: CheckContext) -> list[Finding]:
    tgt, ref = obs.get("target", {}), obs.get("reference", {})
    if tgt.get("crash"):
        return [Finding(check="runs", severity="error", title=f"crashes on the target: {tgt['crash']}",
                        detail="The child process running the target died; the reference side ran.",
                        hint="rerun with --verbose and look at the work folder's stderr.txt")]
    error = tgt.get("error")
    if error:
        detail = []
        if error.get("phase"):
            detail.append(f"phase: {error['phase']}")
        if error.get("module"):
            detail.append(f"module: {error['module']}")
        if error.get("op"):
            detail.append(f"op: {error['op']}")
        hint = ""
        message = error.get("message", "")
        if "not currently implemented for the neuron device" in message or "unsupported" in message.lower():
            hint = "the op has no device kernel and no host fallback: replace it or run it on the CPU explicitly"
        elif "NestedTensor" in message:  # "NestedTensorImpl doesn't support strides", "... 'NestedTensorPrivateUse1'"
            hint = ("the target does not support nested tensors, which PyTorch's TransformerEncoder builds from a "
                    "padding mask when it runs without gradients (eval under no_grad or inference_mode): construct "
                    "it with enable_nested_tensor=False to compute the same with dense tensors")
        elif "SparseTensorImpl" in message or "SparsePrivateUse1" in message:
            hint = ("the target does not support sparse tensors, which nn.Embedding and nn.EmbeddingBag make for "
                    "their gradients with sparse=True: use sparse=False (and a dense optimizer for SparseAdam)")
        return [Finding(check="runs", severity="error", title=f"fails on the target: {message}",
                        where=_where(error.get("source")), detail="; ".join(detail), hint=hint,
                        data={"error": {k: v for k, v in error.items() if k != "traceback"}})]
    return [Finding(check="runs", severity="info",
                    title=f"runs on {ctx.target} ({tgt.get('seconds', 0):.1f} s) and on {ctx.reference} "
                          f"({ref.get('seconds', 0):.1f} s)")]


def check_target_used(obs: dict, ctx: CheckContext) -> list[Finding]:
    """A script that never put anything on the target proves nothing about it, however well it ran."""
    tgt = obs.get("target", {})
    if not tgt.get("ran") or tgt.get("error") or tgt.get("crash"):
        return []
    executed, peak = tgt.get("executed_ops"), tgt.get("device_memory_peak")
    if executed is None and peak is None:
        return []  # the backend can tell neither: the other checks are all there is
    if (executed or 0) > 0 or (peak or 0) > 0:
        return []
    seen = "no op ran on" if executed is not None else "no memory was allocated on"
    hint = ("move the model and its inputs to the device (model.to(device), batch.to(device)) with device = "
            "torch.accelerator.current_accelerator(); drop options that turn the accelerator off (--no-accel, "
            "--cpu), or pass --device {device} after -- if the script takes one")
    detail = "everything ran on the CPU, so nothing about the target was tested"
    accelerate = tgt.get("accelerate") or {}
    if accelerate.get("device", "").startswith("cpu"):
        detail = (f"Hugging Face accelerate {accelerate.get('version', '')} (behind transformers' Trainer) placed "
                  f"the model on the CPU: it does not know the {ctx.device} device")
        hint = (f"accelerate picks among the devices it knows (cuda, xpu, mps, npu, ...), and {ctx.device} is not "
                f"one of them: train with a loop that moves the model and batches with "
                f"torch.accelerator.current_accelerator(), or use an accelerate release that supports "
                f"{ctx.device} (its PrivateUse1 support), then check again")
    return [Finding(
        check="target-used", severity="error", subject="unused",
        title=f"the script never used the target device: {seen} {ctx.device} while it ran",
        detail=detail, hint=hint)]


def check_device_choice(obs: dict, ctx: CheckContext) -> list[Finding]:
    """A script written for CUDA was checked with its cuda taken for the target's device: what it computes
    there is judged, and the one change that makes it so is named. As written, it would not run on the target
    (hard-wired) or would run on the CPU (``"cuda" if torch.cuda.is_available() else "cpu"``)."""
    if obs.get("device_alias") != "cuda" or ctx.device == "cuda" or check_target_used(obs, ctx):
        return []  # a script that never reached the device even so is target-used's finding alone
    return [Finding(
        check="device-choice", severity="warning", subject="cuda",
        title=f"the script is written for CUDA: checked with its cuda taken for {ctx.device}",
        detail=(f"as written it does not reach {ctx.device}: it names cuda, and on a machine without CUDA it fails "
                "or trains on the CPU; every side ran it with cuda meaning its own device (the target's, or the "
                "CPU on the reference), torch.cuda answering for it"),
        hint=("pick the device with device = torch.accelerator.current_accelerator() and use device.type where the "
              "script says \"cuda\" (torch.autocast(device.type), torch.amp.GradScaler(device.type)); torch.cuda "
              "calls become torch.accelerator's (synchronize, memory) or go"))]


# ---------------------------------------------------------------- numerics
def _growth(layers: list[dict]) -> str:
    forward = [x for x in layers if x["phase"] == "forward"]
    bad = next((x for x in forward if not x["ok"]), None)
    if bad is None or not forward:
        return ""
    last = forward[-1]
    fmt = lambda v: "n/a" if v is None else f"{v:.2g}"  # noqa: E731
    return (f"relative error {fmt(bad['rel_error'])} at {bad['label']} (the reference's own: "
            f"{fmt(bad['reference_rel_error'])}), {fmt(last['rel_error'])} at the output {last['label']}")


def check_numerics(obs: dict, ctx: CheckContext) -> list[Finding]:
    loc = obs.get("localization")
    findings: list[Finding] = []
    if obs.get("localization_error"):
        uncopyable = obs["localization_error"].startswith("the model cannot be copied")
        findings.append(Finding(check="numerics", severity="warning", subject="localisation",
                                title=f"layers not compared: {obs['localization_error']}",
                                hint=("the comparison runs copies of the model (copy.deepcopy) on each device: keep "
                                      "what cannot be copied (open files, locks, sockets) out of the module, or "
                                      "give it a __deepcopy__; the verdict rests on the loss curves alone"
                                      if uncopyable else "")))
    if not loc or loc.get("target_failure"):
        return findings
    compiled = obs.get("compiled") or {}
    # Never "eager and compiled outputs match" when nothing compiled was compared; where the failed compile is
    # the target's own failure (the functions convention), the runs check already says so.
    if compiled.get("error") and not (obs.get("target") or {}).get("error"):
        findings.append(Finding(
            check="numerics", severity="warning", subject="compiled",
            title=f"compiled outputs not compared: the compiled check failed: {compiled['error'].get('message', '')}",
            hint="the training itself ran compiled (its loss curve is compared); run the model compiled alone "
                 "to see where its compilation fails"))
    if compiled.get("error"):
        compiled = {}
    compiled_ok = all((compiled.get(k) or {"ok": True})["ok"] for k in ("outputs", "gradients"))
    deterministic = loc.get("reference_deterministic", True)
    leaves = (loc.get("outputs") or {}).get("leaves", 0)
    if loc["ok"] and not deterministic and compiled_ok:
        random_layers = loc.get("random_layers") or []
        findings.append(Finding(
            check="numerics", severity="warning", subject="inconclusive",
            title=(f"numerics inconclusive: two CPU runs of the same inputs differ, so only the "
                   f"{loc.get('compared_layers', 0)} layer values the reference reproduces were judged (they match)"),
            detail=f"not judged from {random_layers[0]} on" if random_layers else "",
            hint="the model draws random numbers in forward besides dropout (which is turned off for the "
                 "comparison): draw them from a seeded torch.Generator you pass in, or rely on the loss curves",
            data={"random_layers": random_layers[:20]}))
        return findings
    if loc["ok"] and compiled_ok:
        what = "eager and compiled " if compiled else ""
        grads = (loc.get("gradients") or {}).get("leaves")
        why = obs.get("gradients_not_compared")
        within = any("device precision" in ((loc.get(k) or {}).get("passed_by") or {}) for k in ("outputs", "gradients"))
        rule = ("within device precision: the noise floor of perturbed reference runs" if within else
                "float64 golden rule, model tolerances")
        modules = ((obs.get("target") or {}).get("model") or {}).get("modules") or {}
        of = f" of {', '.join(modules)} (the first step's top-level modules)" if len(modules) > 1 else ""
        findings.append(Finding(check="numerics", severity="info",
                                title=f"{what}outputs ({leaves}) and gradients ({grads or 0}){of} match the reference "
                                      f"({rule})"
                                      + (f"; gradients not compared: {why}" if why and not grads else "")))
        return findings
    if loc["ok"] and not compiled_ok:
        bad = compiled["outputs"] if not compiled["outputs"]["ok"] else compiled["gradients"]
        first = bad["mismatches"][0] if bad["mismatches"] else {"path": "", "message": ""}
        narrowed = bool((obs.get("target", {}).get("compile") or {}).get("narrowing_losses"))
        findings.append(Finding(
            check="numerics", severity="error", subject="compiled",
            title="compiled outputs differ from the reference while eager matches: the difference comes from compilation",
            detail=f"{first['path']}: {first['message']}",
            hint=("64-bit graph inputs changed when narrowed to 32 bits (see wide-dtypes)" if narrowed else
                  "compare the compiled graph op by op (TORCH_COMPILE_DEBUG=1) or run the layer in eager mode"),
        ))
        return findings
    return findings + [_divergence(loc, obs, check="numerics", compiled_ok=compiled_ok)]


def check_eval_mode(obs: dict, ctx: CheckContext) -> list[Finding]:
    """The compared call in eval mode without gradients, as inference runs it (validate.functions.
    eval_mode_check): kernels that training does not run, which neither the layers nor the curves saw."""
    seen = obs.get("eval_mode")
    if not seen:
        return []
    error = seen.get("error")
    if error:
        return [Finding(check="eval-mode", severity="warning", subject="fails",
                        title=f"the model fails on the target in eval mode ({EVAL_MODE}): {error.get('message', '')}",
                        where=_where(error.get("source")),
                        hint="training runs on the target, inference of this model does not: evaluation, "
                             "generation and serving take this path")]
    if seen.get("not_compared"):
        return [Finding(check="eval-mode", severity="info", subject="not compared",
                        title=f"eval mode not compared: {seen['not_compared']}")]
    if seen.get("reference_error"):
        return [Finding(check="eval-mode", severity="info", subject="not compared",
                        title="eval mode not compared: the model fails on the reference in eval mode: "
                              f"{seen['reference_error'].get('message', '')}")]
    outputs = seen.get("outputs") or {}
    if outputs.get("ok"):
        return [Finding(check="eval-mode", severity="info",
                        title=f"in eval mode ({EVAL_MODE}), outputs ({outputs.get('leaves', 0)}) match the "
                              "reference too")]
    first = (outputs.get("mismatches") or [{"path": "", "message": ""}])[0]
    if seen.get("shapes_differ"):
        return [Finding(check="eval-mode", severity="warning", subject="shapes",
                        title=f"in eval mode ({EVAL_MODE}), the outputs' shapes differ from the reference's",
                        detail=f"{first['path']}: {first['message']}",
                        hint="outputs whose shapes depend on the values (detections kept by a score threshold, "
                             "non-maximum suppression) can change with any rounding difference; compare them "
                             "through a fixed-size output (scores before the threshold)")]
    own, target = seen.get("reference_rel_error"), seen.get("target_rel_error")
    if own is not None and target is not None and target <= SPREAD_MULTIPLE * own:
        return [Finding(check="eval-mode", severity="info", subject="inconclusive",
                        title=f"eval mode inconclusive: the outputs in eval mode ({EVAL_MODE}) move by "
                              f"{own:.2g} (relative) when the reference rounds as the device may, and the "
                              f"target's by {target:.2g}",
                        detail="outputs picked by their values (scores above a threshold, sorted or suppressed "
                               "boxes) change with any rounding; the layers and the curves are judged as before")]
    loc = seen.get("localization") or {}
    if loc and not loc.get("ok") and not loc.get("target_failure"):
        return [_divergence(loc, obs, check="eval-mode", mode=f"in eval mode ({EVAL_MODE}), ")]
    fused = seen.get("unhooked_ops") or []
    return [Finding(
        check="eval-mode", severity="error", subject="outputs",
        title=f"in eval mode ({EVAL_MODE}), outputs differ from the reference"
              + (f"; only a call without hooks ran {', '.join(fused[:3])}" if fused else ""),
        detail=f"{first['path']}: {first['message']}",
        data={"op": fused[0] if len(fused) == 1 else None, "unhooked_ops": fused},
        hint=("layer by layer (with a hook on every module) the model agrees: PyTorch runs some modules as one "
              "fused kernel only where no hook is attached (nn.TransformerEncoderLayer in eval without gradients: "
              "aten::_transformer_encoder_layer_fwd); check that kernel alone" if loc.get("ok") else
              "the eval-mode call was not localised layer by layer: "
              + (seen.get("localization_error") or (loc.get("target_failure") or {}).get("message", "no result"))))]


EVAL_MODE = "model.eval(), no gradients"


def _divergence(loc: dict, obs: dict, *, check: str, mode: str = "", compiled_ok: bool = True) -> Finding:
    """The finding of a localisation that diverged: the first diverging layer and, where one explains it, the
    op, its source line and what the device's documented precision says of it."""
    ops = loc.get("ops") or {}
    op = ops.get("first")
    first_layer = loc.get("first_forward") or loc.get("first_backward") or {}
    culprit = loc.get("culprit") or first_layer.get("module", "?")
    manifest = (obs.get("manifest") or {}).get("target")
    expl = explain(op["op"], op.get("scale_error"), manifest) if op else None
    layer_type = next((x["type"] for x in loc["layers"] if x["module"] == culprit), "")
    pass_ = first_layer.get("phase", "forward")
    if op:
        title = (f"{'outputs' if pass_ == 'forward' else 'gradients'} differ from the reference: first diverging "
                 f"layer {culprit}{f' ({layer_type})' if layer_type else ''}, op {op['op']}")
    else:
        title = (f"{'outputs' if pass_ == 'forward' else 'gradients'} differ from the reference: first diverging "
                 f"layer {first_layer.get('label', culprit)}")
    detail = []
    for key in ("outputs", "gradients"):
        cmp = loc.get(key)
        if cmp and not cmp["ok"] and cmp["mismatches"]:
            m = cmp["mismatches"][0]
            more = len(cmp["mismatches"]) - 1
            detail.append(f"{m['path']}: {m['message']}" + (f" (+{more} more)" if more > 0 else ""))
    growth = _growth(loc["layers"])
    if growth:
        detail.append(growth)
    if first_layer and first_layer.get("module") != culprit:
        detail.append(f"first diverging {'output' if pass_ == 'forward' else 'gradient'}: {first_layer['label']}")
    if op:
        detail.append(f"op {op['op']} (#{op['index']} of the layer, run alone with the reference's inputs): {op['message']}")
    if ops.get("note"):
        detail.append(ops["note"])
    if not compiled_ok:
        detail.append("the compiled model differs as well")
    severity = "warning" if expl is not None else "error"  # a layer the reference reproduces diverged
    hint = expl.text if expl else (
        f"the target computes {op['op']} differently from the CPU beyond its precision: check this op alone "
        f"(neuron-conformance ops --ops {op['op'].removeprefix('aten::')})" if op else
        "no single op explains it: the error accumulates inside the layer")
    return Finding(
        check=check, severity=severity, subject=f"{culprit}:{op['op'] if op else ''}", title=mode + title,
        where=_where(op.get("source")) if op else None, detail="\n".join(detail), hint=hint,
        data={"culprit": culprit, "op": op["op"] if op else None, "phase": pass_,
              "explained_by": expl.feature if expl else None},
    )


# ---------------------------------------------------------------- host fallback
def check_fallback(obs: dict, ctx: CheckContext) -> list[Finding]:
    tracked = obs.get("target", {}).get("fallback_ops") or []
    # Seen independently of the backend: host<->device copies inside the op during the layer comparison.
    copies = (obs.get("localization") or {}).get("host_copies") or {}
    sources = obs.get("op_sources") or {}
    findings = []
    for op in sorted({*tracked, *copies}):
        where = sources.get(op, [])
        seen = [] if op not in copies else [
            f"seen in the execution trace: {copies[op]} host<->device copies inside {op}"
            + ("" if op in tracked else " (the backend did not report it)")]
        findings.append(Finding(
            check="host-fallback", severity="warning", subject=op,
            title=f"{op} ran on the host (CPU fallback) instead of the device",
            where=where[0] if where else None,
            detail="; ".join([*seen, *(["also at " + ", ".join(where[1:])] if len(where) > 1 else [])]),
            hint="each call copies its inputs to the host and the result back; keep it out of the hot loop, "
                 "or replace it with ops the device implements",
        ))
    return findings


# ---------------------------------------------------------------- placement
def check_placement(obs: dict, ctx: CheckContext) -> list[Finding]:
    findings: list[Finding] = []
    events = obs.get("placement_events") or []
    created = [e for e in events if e["kind"] == "cpu_tensor"]
    scan = obs.get("target", {}).get("placement") or {}
    stray = scan.get("unregistered_modules") or []
    left = [t["name"] for t in scan.get("plain_tensors") or [] if t["device"] == "cpu"]
    left += [t["name"] for t in scan.get("cpu_state") or []] + [f"the weights of {m}" for m in stray]
    for e in events:
        where = _where(e.get("source"))
        count = f" ({e['count']} times)" if e.get("count", 1) > 1 else ""
        if e["kind"] == "mixed":
            origin = next((c for c in created if c.get("module") == e.get("module")), None)
            if origin is not None:
                hint = (f"the CPU tensor comes from {origin['op']} at {_where(origin.get('source'))}: create it "
                        "with device=<input>.device")
            elif left:
                hint = f"the CPU tensor is probably {', '.join(left[:3])}, which model.to(device) did not move"
            else:
                hint = "move the tensor to the device, or create it there"
            findings.append(Finding(
                check="placement", severity="error", subject=f"mixed:{e['op']}:{where}",
                title=f"{e['op']} mixes a CPU tensor with {ctx.device} tensors in forward{count}",
                where=where, detail=("a real device raises 'Expected all tensors to be on the same device'"
                                     + ("; the emulated device copies silently" if ctx.emulated else "")
                                     + (f"; module {e['module']}" if e.get("module") else "")),
                hint=hint))
        elif e["kind"] == "cpu_tensor":
            findings.append(Finding(
                check="placement", severity="warning", subject=f"cpu_tensor:{e['op']}:{where}",
                title=f"tensor created on the CPU during forward: {e['op']}{count}", where=where,
                detail=f"module {e['module']}" if e.get("module") else "",
                hint="pass device=<input>.device when creating it, or register it once as a buffer"))
        elif e["kind"] == "to_host":
            findings.append(Finding(
                check="placement", severity="warning", subject=f"to_host:{e['op']}:{where}",
                title=f"device-to-host copy during forward{count}", where=where,
                hint="each copy waits for the device (.item(), .cpu(), printing a tensor): keep it out of forward"))
        elif e["kind"] == "to_device":
            findings.append(Finding(
                check="placement", severity="warning", subject=f"to_device:{e['op']}:{where}",
                title=f"host-to-device copy during forward{count}", where=where,
                hint="a tensor built on the CPU is copied to the device at every call: build it on the device "
                     "or register it as a buffer"))
    state = scan.get("cpu_state") or []
    if state:
        names = ", ".join(x["name"] for x in state[:5]) + (f" and {len(state) - 5} more" if len(state) > 5 else "")
        findings.append(Finding(
            check="placement", severity="warning", subject="cpu_state",
            title=f"{len(state)} parameters or buffers left on the CPU: {names}",
            hint="move the whole model with model.to(device) after building it, and register buffers with "
                 "register_buffer so that .to() moves them"))
    if stray and ctx.device != "cpu":
        findings.append(Finding(
            check="placement", severity="warning", subject="unregistered_modules",
            title=f"modules with weights held in a plain list or dict: {', '.join(stray[:5])}; model.to(device) "
                  "left them on the CPU, and model.parameters() does not list them",
            hint="hold them in nn.ModuleList or nn.ModuleDict, so that .to() moves them and the optimizer trains them"))
    for t in scan.get("plain_tensors") or []:
        if t["device"] == "cpu" and ctx.device != "cpu":
            findings.append(Finding(
                check="placement", severity="warning", subject=f"plain:{t['name']}",
                title=f"tensor attribute {t['name']} {tuple(t['shape'])} is not a parameter or buffer: "
                      "model.to(device) left it on the CPU",
                hint="register it with self.register_buffer(name, tensor) (persistent=False if it is not state)"))
    return findings


# ---------------------------------------------------------------- recompilation
def _next_pow2(v: int) -> int:
    return 1 << max(0, (v - 1).bit_length())


def check_script_compiles(obs: dict, ctx: CheckContext) -> list[Finding]:
    """A script that compiles its own model (nanoGPT's --compile) is compared in the compile convention."""
    where = (obs.get("target") or {}).get("script_compiles") or []
    if not where:
        return []
    how = ("the target ran it compiled with its own backend, the reference eagerly: the curves compare compiled "
           "training against eager" if ctx.mode != "compile" else "compiled on the target, eager on the reference")
    return [Finding(check="compile", severity="info", subject="script",
                    title=f"the script compiles its own model (torch.compile at {', '.join(where[:3])}): {how}")]


def check_recompilation(obs: dict, ctx: CheckContext) -> list[Finding]:
    comp = obs.get("target", {}).get("compile")
    if not comp:
        return []
    events = comp.get("events") or []  # one per graph, with the model's train()/eval() mode where known
    families: dict[tuple, list[dict]] = defaultdict(list)
    for e in events:
        families[(tuple(len(s) for s in e["shapes"]), tuple(e["dtypes"]))].append(e)
    findings = []
    for family, items in families.items():
        signatures = defaultdict(int)
        for e in items:
            signatures[tuple(tuple(s) for s in e["shapes"])] += 1
        if len(signatures) > 1:
            shapes = list(signatures)
            varying = []
            for i in range(len(shapes[0])):
                for d in range(len(shapes[0][i])):
                    values = {s[i][d] for s in shapes}
                    if len(values) > 1 and all(isinstance(v, int) for v in values):  # not a symbolic dim
                        values = sorted(values)
                        varying.append((i, d, values))
            lines = []
            hints = []
            for i, d, values in varying[:4]:
                buckets = sorted({_next_pow2(v) for v in values})
                lines.append(f"input {i} dim {d}: {', '.join(map(str, values[:12]))}{' ...' if len(values) > 12 else ''}")
                hints.append(f"pad input {i} dim {d} to {max(values)} (1 graph) or to powers of two "
                             f"({', '.join(map(str, buckets))}: {len(buckets)} graphs)")
            inputs = sorted({i for i, _, _ in varying})[:2]
            shown = "; ".join(" ".join(str(list(s[i])) for i in inputs) for s in shapes[:6])
            findings.append(Finding(
                check="recompilation", severity="warning", subject=f"graph{len(findings)}",
                title=f"compiled {len(items)} times for {len(signatures)} different input shapes",
                detail="shapes that vary: " + "; ".join(lines) + (f"\nshapes seen: {shown}" if shown else ""),
                hint=("the neuron backend compiles one graph per input shape (dynamic=True is not supported): "
                      + "; ".join(hints)),
                data={"compilations": len(items), "shapes": len(signatures),
                      "varying": [{"input": i, "dim": d, "values": v} for i, d, v in varying]}))
        # A model compiled in train() and again in eval() has one graph per mode: expected, and said so.
        per_mode = defaultdict(int)
        for e in items:
            per_mode[(tuple(tuple(s) for s in e["shapes"]), e.get("training"))] += 1
        switches = sum(1 for (s, mode) in per_mode if mode is not None) - len(
            {s for (s, mode) in per_mode if mode is not None})
        if switches:
            findings.append(Finding(
                check="recompilation", severity="info", subject=f"modes{len(findings)}",
                title=f"compiled again {switches} time{'s' if switches != 1 else ''} on switches between "
                      "model.train() and model.eval(): one graph per mode, as expected"))
        repeated = {s: n for (s, _), n in per_mode.items() if n > 1}
        if repeated:
            findings.append(Finding(
                check="recompilation", severity="warning", subject=f"repeat{len(findings)}",
                title=f"recompiled {sum(repeated.values()) - len(repeated)} times for input shapes it had compiled before",
                hint="a guard on a Python value (a changing int or flag in forward) fails at each call: "
                     "make it a tensor or a constant"))
    if not findings and events:
        findings.append(Finding(check="recompilation", severity="info",
                                title=f"{len(events)} graph compilation{'s' if len(events) != 1 else ''}, "
                                      "no recompilation for new input shapes"))
    return findings


# ---------------------------------------------------------------- 64-bit tensors
def check_wide_dtypes(obs: dict, ctx: CheckContext) -> list[Finding]:
    tgt = obs.get("target", {})
    if ctx.mode != "compile" and not tgt.get("script_compiles"):
        return []  # eager code keeps its dtypes: the narrowing happens in compiled graphs only
    if ctx.device != "neuron":
        return []  # neuronx-cc's narrowing of 64-bit types; inductor and other compilers keep them
    wide = tgt.get("wide_tensors") or []
    findings = []
    when = "in the compiled graphs" if ctx.mode == "compile" else "when the model is compiled (torch.compile)"
    floats = [w for w in wide if w["dtype"] == "float64"]
    ints_bad = [w for w in wide if w["dtype"] == "int64" and not w.get("fits", True)]
    ints_ok = [w for w in wide if w["dtype"] == "int64" and w.get("fits", True)]

    def names(items):
        return ", ".join(f"{w['name']} {tuple(w['shape'])}" for w in items[:4]) + (
            f" and {len(items) - 4} more" if len(items) > 4 else "")

    if floats:
        lossy = [w for w in floats if not w.get("fits", True)]
        findings.append(Finding(
            check="wide-dtypes", severity="warning" if lossy else "info", subject="float64",
            title=f"float64 tensors become float32 {when}: {names(floats)}",
            hint="Neuron computes in at most 32 bits: use float32, or keep float64 work on the host"))
    if ints_bad:
        findings.append(Finding(
            check="wide-dtypes", severity="warning", subject="int64-overflow",
            title=f"int64 values beyond the int32 range become int32 {when}: {names(ints_bad)}",
            hint="values above 2**31 wrap when narrowed; rescale them or keep them on the host"))
    if ints_ok:
        findings.append(Finding(
            check="wide-dtypes", severity="info", subject="int64",
            title=f"int64 tensors become int32 {when}; their values fit: {names(ints_ok)}"))
    for line in (tgt.get("compile") or {}).get("narrowing_losses") or []:
        findings.append(Finding(check="wide-dtypes", severity="warning", subject=f"narrowed:{line}",
                                title=f"a compiled graph input lost values when narrowed to 32 bits: {line}"))
    return findings


# ---------------------------------------------------------------- loss curves, speed
def curve_comparison(obs: dict, tolerance: CurveTolerance) -> CurveComparison | None:
    """The target's curve (its draws the reference's, diff.draws) against the reference's, in the band of the
    perturbed reference runs; where they were expected and none came, the narrowest band, never a wider one."""
    ref = (obs.get("reference") or {}).get("curve")
    tgt = (obs.get("target") or {}).get("curve")
    if not ref or not tgt:
        return None
    perturbed = [LossCurve.from_dict(c) for c in obs.get("perturbed_curves") or ()]
    return compare_curves(LossCurve.from_dict(ref), LossCurve.from_dict(tgt), tolerance, perturbed,
                          floor_only=bool(obs.get("perturbed_expected")) and not perturbed)


def own_stream_comparison(obs: dict, tolerance: CurveTolerance) -> CurveComparison | None:
    """The target on its own random stream against the reference, in the band of reference runs whose draws
    on the device came from other streams: a distribution check (None where the target drew nothing there)."""
    own = obs.get("own_stream") or {}
    ref = (obs.get("reference") or {}).get("curve")
    if not own.get("target") or not ref:
        return None
    streams = [LossCurve.from_dict(c) for c in own.get("streams") or ()]
    return compare_curves(LossCurve.from_dict(ref), LossCurve.from_dict(own["target"]), tolerance, streams,
                          floor_only=not streams)


START_ROUNDING = 1e-2  # of a tensor's root mean square: far above rounding, far below unrelated values


def same_start_within_rounding(ref: list | None, tgt: list | None) -> bool:
    """Whether the two sides' tensors (their ``validate.probes.sketch``, one per floating tensor) agree within
    ``START_ROUNDING`` of their magnitude: the same start, where the exact hashes differ."""
    if not ref or not tgt or len(ref) != len(tgt):
        return False
    for a, b in zip(ref, tgt):
        if len(a) != len(b) or None in a or None in b:
            return False
        scale = max(a[0], b[0])
        if any(abs(x - y) > START_ROUNDING * scale for x, y in zip(a, b)):
            return False
    return True


def check_curves(obs: dict, ctx: CheckContext) -> list[Finding]:
    findings = []
    ref_fp = (obs.get("reference") or {}).get("fingerprints") or {}
    tgt_fp = (obs.get("target") or {}).get("fingerprints") or {}
    # Values within rounding of each other are the same start, reached through each device's arithmetic:
    # the model's first call came after training steps (a torch.func loop, layers trained one by one).
    differ = [k for k in ("parameters", "inputs") if k in ref_fp and k in tgt_fp and ref_fp[k] != tgt_fp[k]
              and not same_start_within_rounding(ref_fp.get(f"{k}_sketch"), tgt_fp.get(f"{k}_sketch"))]
    draws = obs.get("draws") or {}
    start_hint = ""
    # Every random draw of the target was the reference's (diff.draws): a different start is the script's doing.
    if "parameters" in differ:
        start_hint = ("the script initialises or loads the model differently when an accelerator is present "
                      "(another seed, another initialisation, a checkpoint read only there)")
        findings.append(Finding(check="same-start", severity="warning", subject="weights",
                                title="the reference and the target start from different weights",
                                detail="the parameters differ at the model's first call" +
                                       (" (and so does its first input)" if "inputs" in differ else ""),
                                hint=start_hint))
    elif "inputs" in differ:
        start_hint = ("the script's data depends on the device: it shuffles, samples or loads differently when an "
                      "accelerator is present (DataLoader options set only for an accelerator); make the pipeline "
                      "the same on both sides (same seed, the same options)")
        findings.append(Finding(check="same-start", severity="warning", subject="data",
                                title="the reference and the target see different data or data order: their first "
                                      "batches differ (same weights)",
                                hint=start_hint))
    if draws.get("parting"):
        unshared = draws.get("unshared") or []
        findings.append(Finding(
            check="randomness", severity="warning", subject="parting",
            title=f"the sides ask for different random numbers from {draws['parting']}",
            hint=(f"{', '.join(unshared)} has no CPU kernel to take the reference's draw from, so the target drew "
                  "its own numbers there" if unshared else
                  "the script takes another path on the target (a branch on a value, or on the device)") +
                 "; the draws after this one are not the reference's, and the loss curves after it compare "
                 "different computations", data=draws))
    for problem in obs.get("harness") or ():
        findings.append(Finding(check="harness", severity="warning", subject=problem.split(":")[0],
                                title=f"a side the bands need did not run: {problem}",
                                hint="a problem of the harness or the machine, not of the target: the band of the "
                                     "curves is the narrowest one; run the check again"))
    cmp = curve_comparison(obs, ctx.curve_tolerance)
    if cmp is None:
        return findings
    data = {"steps": cmp.steps, "diverged_at": cmp.diverged_at, "max_rel_gap": cmp.max_rel_gap,
            "failing_steps": cmp.failing_steps, "band_rel": json_float(cmp.band_rel)}
    if draws.get("on_device"):
        data["draws_on_device"] = draws["on_device"]
    shared = (f" (the target took the reference's {draws['on_device']} random draws on the device)"
              if draws.get("on_device") else "")
    steps = (obs.get("target") or {}).get("steps") or {}
    if steps.get("optimizer") and steps.get("backward", 0) > steps["optimizer"]:
        data["backward_passes"] = steps["backward"]
        if steps.get("closure"):
            shared += (f"; a step is an optimizer step: {steps['optimizer']} steps over {steps['backward']} backward "
                       f"passes (the optimizer's closure, evaluated inside step()), each step's loss the closure's "
                       f"first, as step(closure) returns it")
        else:
            why = (f"{steps['optimizers']} optimizers taking turns" if steps.get("optimizers", 1) > 1
                   else "gradient accumulation")
            shared += (f"; a step is an optimizer step: {steps['optimizer']} steps over {steps['backward']} "
                       f"backward passes ({why}), each step's loss the mean of the passes since the last step")
    if cmp and not cmp.informative:
        findings.append(Finding(check="loss-curves", severity="warning", title=f"{cmp.summary()}{shared}",
                                detail=cmp.note, data=data,
                                hint="the reference's own spread is so wide that a 5% shift of the loss would pass: "
                                     "compare fewer steps, or a less chaotic setting (a smaller learning rate)"))
    elif cmp:
        findings.append(Finding(check="loss-curves", severity="info", title=f"{cmp.summary()}{shared}",
                                detail=cmp.note, data=data))
    elif differ:
        # Different starting points make the curves incomparable: that is the script's doing, not the target's.
        findings.append(Finding(check="loss-curves", severity="warning",
                                title=f"{cmp.summary()} (inconclusive: the runs start from different "
                                      f"{'weights' if 'parameters' in differ else 'data'})",
                                detail=ctx.curve_tolerance.describe(), hint=start_hint, data=data))
    else:
        findings.append(Finding(check="loss-curves", severity="error", title=f"{cmp.summary()}{shared}",
                                detail=(cmp.note + "\n" if cmp.note else "") + ctx.curve_tolerance.describe(),
                                hint=_divergence_hint(obs), data=data))
    findings += _check_own_stream(obs, ctx)
    ratio = cmp.speed_ratio
    if ratio is not None:
        t, r = cmp.target.steps_per_second, cmp.reference.steps_per_second
        note = " (emulated device: not a measure of Trainium speed)" if ctx.emulated else ""
        alias = obs.get("device_alias")
        if alias:  # validate.named_device: a function mode over every torch call on the sides that translate
            sides = "the reference" if alias == ctx.device else "both sides"
            note += f"; {sides} ran with the script's {alias} translated call by call, slower than alone"
        findings.append(Finding(check="speed", severity="info",
                                title=f"target {ratio:.2f}x the reference's speed: {t:.2f} vs {r:.2f} steps/s{note}",
                                data={"ratio": ratio, "target_steps_per_s": t, "reference_steps_per_s": r}))
    return findings


def _divergence_hint(obs: dict) -> str:
    """Where to look when the curves part: the first diverging layer, when the layer comparison found one."""
    loc = obs.get("localization") or {}
    if loc and not loc.get("ok", True) and (loc.get("first_forward") or loc.get("first_backward")):
        return "see the first diverging layer above; a gap that grows step by step points at the gradients"
    if not loc:
        return ("layers are not compared in this check (--nproc, --no-localize); a gap that grows step by step "
                "points at the gradients: their reduction across ranks, or the optimizer")
    return ("the compared call's layers agree, so the error enters later: in another call of the model, the loss, "
            "the gradients' use by the optimizer, or a step the layer comparison does not see")


def _check_own_stream(obs: dict, ctx: CheckContext) -> list[Finding]:
    """The target on its own random stream, judged as a distribution (see own_stream_comparison)."""
    failure = (obs.get("own_stream") or {}).get("failure")
    if failure:  # its random kernels ran only here: the shared run took the reference's draws on the CPU
        return [Finding(check="random-stream", severity="error", subject="fails",
                        title=f"with its own random numbers the target fails: {failure}",
                        hint="the device's random ops run only in this training (the compared one took the "
                             "reference's draws): one of them raises, crashes or hangs on the target")]
    own = own_stream_comparison(obs, ctx.curve_tolerance)
    if own is None:
        return []
    differences = (obs.get("own_stream") or {}).get("draw_differences") or []
    findings = [Finding(check="random-stream", severity="error", subject=f"draws:{d.split(':')[0]}",
                        title=f"the device's random numbers follow another distribution than the CPU's: {d}",
                        hint="a random op of the device draws with a wrong scale, rate or range (compare its "
                             "documented distribution); independent streams of one distribution do not differ so")
                for d in differences]
    runs = len((obs.get("own_stream") or {}).get("streams") or ())
    data = {"steps": own.steps, "diverged_at": own.diverged_at, "max_rel_gap": own.max_rel_gap,
            "failing_steps": own.failing_steps, "band_rel": json_float(own.band_rel), "stream_runs": runs}
    head = (f"with its own random numbers, the target's loss curve "
            f"{'lies within' if own else 'leaves'} the band of {runs} reference runs drawing from other streams")
    if not own:
        return findings + [Finding(
            check="random-stream", severity="error", title=f"{head}: {own.summary()}",
            detail=ctx.curve_tolerance.describe(), data=data,
            hint="independent random streams do not explain the gap: the device's random ops (their distribution: "
                 "dropout's rate, the normal's scale) or the code downstream of them differ")]
    if not own.informative:
        spread = (f"{100 * own.band_rel:.0f}%" if own.unbounded_from is None
                  else f"no bound (one stops being finite at step {own.unbounded_from})")
        return findings + [Finding(check="random-stream", severity="info",
                                   title=f"not informative: {head}, but other streams alone move the loss by "
                                         f"{spread}, so a 5% shift would not be seen", data=data)]
    return findings + [Finding(check="random-stream", severity="info", title=f"{head}: {own.summary()}", data=data)]


# ---------------------------------------------------------------- outputs
def check_outputs(obs: dict, ctx: CheckContext) -> list[Finding]:
    """Files the script writes: each side writes into a working directory of its own, except files that
    existed before, which both sides write through."""
    sides = {side: (obs.get(side) or {}).get("outputs") or {} for side in ("reference", "target")}
    findings = []
    ref, tgt = set(sides["reference"].get("shared", [])), set(sides["target"].get("shared", []))
    both = sorted(ref | tgt)
    if both:
        who = "both sides wrote" if ref & tgt else f"the {'target' if tgt else 'reference'} side wrote"
        findings.append(Finding(
            check="outputs", severity="warning", subject="shared",
            title=f"{who} {', '.join(both[:3])}{' ...' if len(both) > 3 else ''} in your working directory: "
                  "the file that remains is one side's, and either side may have read the other's",
            hint="write outputs to a new path (a {device} placeholder after -- makes one per side), or remove the "
                 "file before the check"))
    created = sides["target"].get("created", [])
    if created:
        findings.append(Finding(
            check="outputs", severity="info", subject="created",
            title=f"the script wrote {len(created)} file{'s' if len(created) != 1 else ''} "
                  f"({', '.join(created[:3])}{' ...' if len(created) > 3 else ''}); each side's are kept apart",
            detail=f"target: {sides['target'].get('cwd', '')}; reference: {sides['reference'].get('cwd', '')}"))
    return findings


CHECKS = (check_runs, check_target_used, check_device_choice, check_numerics, check_eval_mode, check_fallback,
          check_placement, check_script_compiles, check_recompilation, check_wide_dtypes, check_curves, check_outputs)


def run_checks(obs: dict, ctx: CheckContext) -> list[Finding]:
    """All findings, in check order."""
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(obs, ctx))
    return findings


def finite_or_none(x):
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
