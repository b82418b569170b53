"""The reference cache round-trips values and stays within its size bounds."""

import torch

from runner.refcache import MAX_ENTRY_BYTES, ReferenceCache


def test_round_trip_and_bounds(tmp_path):
    cache = ReferenceCache(str(tmp_path / "c.sqlite"), reference="cpu", max_bytes=1 << 30)
    value = {"samples": [{"value": torch.arange(6.0).reshape(2, 3), "error": None}]}
    assert cache.put("small", value)
    got = cache.get("small")
    assert torch.equal(got["samples"][0]["value"], value["samples"][0]["value"])
    big = {"samples": [{"value": torch.zeros(MAX_ENTRY_BYTES // 4 + 1024)}]}
    assert not cache.put("big", big) and cache.get("big") is None  # over the per-entry bound: not stored
    full = ReferenceCache(str(tmp_path / "c.sqlite"), reference="cpu", max_bytes=0)
    assert not full.put("more", value) and full.get("more") is None  # the file is over its bound
    assert full.get("small") is not None  # what is there is still read
