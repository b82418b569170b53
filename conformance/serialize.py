"""Saving nested Python values of tensors without pickle.

Values are nested tuples, lists and string-keyed dicts of tensors, numbers,
strings, dtypes, devices, memory formats, slices and Ellipsis. They are
written with ``torch.save`` as a JSON structure plus a list of tensors (a
view keeps its strides, and its storage and offset unless that storage is
far larger than the view), and read back with
``torch.load(weights_only=True)``, which never unpickles
arbitrary objects. Used for the reference cache and for reproducer inputs.
"""

from __future__ import annotations

import io
import json
from typing import Any

import torch


MAX_SPAN_PADDING = 1024  # elements a view's saved storage may hold beyond 4x its own


class Unserializable(TypeError):
    pass


def value_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a strided tensor's values in row-major order, for hashing: read from a copy on the CPU,
    never from the tensor's own storage, because NumPy's view of a storage marks it not resizable (a QAT
    observer's ``resize_`` of its own buffer then failed in the script, on the CPU reference, after the
    harness had hashed the model's weights there)."""
    if not t.numel():
        return b""
    flat = torch.empty(t.numel(), dtype=t.dtype)
    flat.copy_(t.detach().resolve_conj().resolve_neg().reshape(-1))
    return flat.view(torch.uint8).numpy().tobytes()


def _storage_elements(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes() // t.element_size()


def _saved_elements_limit(t: torch.Tensor) -> int:
    return max(4 * t.numel(), MAX_SPAN_PADDING)


def saves_exactly(t: torch.Tensor) -> bool:
    """Whether a dense tensor comes back with its storage, offset and strides, not only its values and layout."""
    return t.layout == torch.strided and _storage_elements(t) <= _saved_elements_limit(t)


def _encode(value: Any, tensors: list[torch.Tensor]):
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu()
        node = {"__t": len(tensors), "rg": bool(value.requires_grad),
                "dev": "cpu_argument" if getattr(value, "keep_on_cpu", False) else value.device.type}
        if t.layout != torch.strided:
            tensors.append(t)
            return node
        t = t.resolve_conj().resolve_neg()
        storage = _storage_elements(t)
        span = 1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())) if t.numel() else 0
        if t.is_contiguous() and t.storage_offset() == 0 and storage == t.numel():
            tensors.append(t.clone())
        elif saves_exactly(t):
            # A view (transposed, sliced, expanded, channels-last, offset): its whole storage, so the layout
            # and what lies around the view (which as_strided-style ops read) come back as they were.
            tensors.append(t.as_strided((storage,), (1,), 0).clone())
            node.update(shape=list(t.shape), stride=list(t.stride()), offset=t.storage_offset())
        elif span <= _saved_elements_limit(t):  # the layout, without the rest of a large storage
            tensors.append(t.as_strided((span,), (1,)).clone())
            node.update(shape=list(t.shape), stride=list(t.stride()), offset=0)
        else:  # a view far sparser than its storage: its values only
            tensors.append(t.contiguous().clone())
        return node
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return {"__f": repr(value)}
    if isinstance(value, complex):
        return {"__c": [repr(value.real), repr(value.imag)]}
    if isinstance(value, torch.dtype):
        return {"__dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"__device": str(value)}
    if isinstance(value, torch.memory_format):
        return {"__memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"__layout": str(value).removeprefix("torch.")}
    if value is Ellipsis:
        return {"__ellipsis": True}
    if isinstance(value, slice):
        return {"__slice": [_encode(value.start, tensors), _encode(value.stop, tensors), _encode(value.step, tensors)]}
    if isinstance(value, tuple):
        return {"__tuple": [_encode(v, tensors) for v in value]}  # named tuples come back as plain tuples
    if isinstance(value, list):
        return [_encode(v, tensors) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {"__dict": {k: _encode(v, tensors) for k, v in value.items()}}
    raise Unserializable(f"cannot save a {type(value).__name__}")


def _decode(node: Any, tensors: list, requires_grad: bool = False):
    if isinstance(node, list):
        return [_decode(v, tensors, requires_grad) for v in node]
    if isinstance(node, dict):
        if "__t" in node:
            t = tensors[node["__t"]]
            if "stride" in node:  # a view, saved with the storage it reaches
                t = t.as_strided(node["shape"], node["stride"], node.get("offset", 0))
            t._saved_on = node.get("dev", "cpu")  # where the tensor lived when it was saved
            return t.requires_grad_(True) if requires_grad and node.get("rg") else t
        if "__f" in node:
            return float(node["__f"])
        if "__c" in node:
            return complex(float(node["__c"][0]), float(node["__c"][1]))
        if "__dtype" in node:
            return getattr(torch, node["__dtype"])
        if "__device" in node:
            return torch.device(node["__device"])
        if "__memory_format" in node:
            return getattr(torch, node["__memory_format"])
        if "__layout" in node:
            return getattr(torch, node["__layout"])
        if "__ellipsis" in node:
            return Ellipsis
        if "__slice" in node:
            return slice(*(_decode(v, tensors, requires_grad) for v in node["__slice"]))
        if "__tuple" in node:
            return tuple(_decode(v, tensors, requires_grad) for v in node["__tuple"])
        if "__dict" in node:
            return {k: _decode(v, tensors, requires_grad) for k, v in node["__dict"].items()}
    return node


def pack(value: Any) -> bytes:
    tensors: list[torch.Tensor] = []
    structure = json.dumps(_encode(value, tensors))
    buffer = io.BytesIO()
    torch.save({"structure": structure, "tensors": tensors}, buffer)
    return buffer.getvalue()


def unpack(payload: bytes, *, requires_grad: bool = False) -> Any:
    """Reads a packed value; ``requires_grad`` restores the flag on tensors that had it."""
    data = torch.load(io.BytesIO(payload), weights_only=True)
    return _decode(json.loads(data["structure"]), data["tensors"], requires_grad)
