"""conformance.serialize: nested values round-trip through torch.load(weights_only=True) with their layouts."""

from __future__ import annotations

import pytest
import torch

from conformance.serialize import Unserializable, pack, unpack


def layouts() -> dict[str, torch.Tensor]:
    return {
        "transposed": torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2),
        "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "sliced": torch.arange(100.0)[10:40:3],
        "zero_d": torch.tensor(3.5),
        "empty": torch.empty(0, 3),
        "int": torch.arange(6).reshape(2, 3).t(),
    }


@pytest.mark.parametrize("name", list(layouts()))
def test_tensors_come_back_with_their_values_shape_and_strides(name):
    original = layouts()[name]
    restored = unpack(pack({"x": original}))["x"]
    assert restored.dtype == original.dtype and restored.shape == original.shape
    assert restored.stride() == original.stride()
    assert torch.equal(restored, original)


def test_a_strided_view_saves_its_span_not_its_whole_storage():
    big = torch.arange(1_000_000.0)
    assert len(pack(big[5:15].t())) < 10_000
    assert len(pack(big[:40].reshape(4, 10).t())) < 10_000


def test_nested_structure_requires_grad_and_non_tensor_values():
    value = [torch.randn(3, 2).t().requires_grad_(), (1, 2.5, -0.0, float("inf"), 1 + 2j),
             {"dim": -1, "dtype": torch.float16, "slice": slice(1, None), "e": Ellipsis, "s": "mean"}]
    restored = unpack(pack(value), requires_grad=True)
    assert restored[0].requires_grad and restored[0].is_leaf and restored[0].stride() == value[0].stride()
    assert restored[1][:3] == (1, 2.5, -0.0) and str(restored[1][2]) == "-0.0"
    assert restored[1][3] == float("inf") and restored[1][4] == 1 + 2j
    assert restored[2] == {"dim": -1, "dtype": torch.float16, "slice": slice(1, None), "e": Ellipsis, "s": "mean"}
    assert not unpack(pack(value))[0].requires_grad


def test_objects_that_need_pickle_are_refused():
    with pytest.raises(Unserializable):
        pack({"gen": torch.Generator()})


def test_a_view_comes_back_with_its_storage_and_offset():
    base = torch.arange(20.0)
    view = base[10:14].reshape(2, 2).t()
    restored = unpack(pack(view))
    assert restored.storage_offset() == 10 and restored.stride() == view.stride()
    assert torch.equal(torch.as_strided(restored, (3,), (1,), 0), base[:3])  # what as_strided-style ops read
