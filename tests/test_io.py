"""lexgraph.io.save_tensors: safetensors files whose bytes depend only on their content."""

import json
import struct

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from lexgraph.io import save_tensors


def _tensors():
    g = torch.Generator().manual_seed(0)
    return {"vectors": torch.randn(5, 3, generator=g), "ids": torch.arange(5), "offsets": torch.tensor([0, 2, 5])}


def test_same_content_same_bytes(tmp_path):
    # safetensors' own writer orders __metadata__ from a randomly seeded hash map: ten writes
    # of six keys in one process gave ten different byte strings before this writer
    metadata = {k: f"value {k}" for k in "fedcba"}
    blobs = set()
    for i in range(10):
        path = tmp_path / f"t{i}.safetensors"
        save_tensors(_tensors(), path, metadata)
        blobs.add(path.read_bytes())
    assert len(blobs) == 1


def test_round_trip_header_sorted_and_aligned(tmp_path):
    path = tmp_path / "t.safetensors"
    tensors = _tensors()
    save_tensors(tensors, path, {"z": "1", "a": "2"})
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    for name, tensor in tensors.items():
        assert torch.equal(loaded[name], tensor)
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"a": "2", "z": "1"}
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    assert length % 8 == 0
    header = raw[8 : 8 + length].decode().rstrip(" ")
    assert list(json.loads(header)) == sorted(json.loads(header))
    assert list(json.loads(header)["__metadata__"]) == ["a", "z"]


def test_no_metadata(tmp_path):
    path = tmp_path / "t.safetensors"
    save_tensors({"x": torch.ones(2)}, path)
    with safe_open(str(path), "pt") as f:
        assert not f.metadata()
    assert torch.equal(load_file(path)["x"], torch.ones(2))


def test_load_tensors_names_the_file_and_the_remedy(tmp_path):
    import pytest

    from lexgraph.errors import DataError
    from lexgraph.io import load_tensors

    path = tmp_path / "e.safetensors"
    with pytest.raises(DataError, match=r"e\.safetensors.*embeddings file not found; run it"):
        load_tensors(path, "embeddings file", "run it")
    save_tensors(_tensors(), path, {"a": "1"})
    assert torch.equal(load_tensors(path, "embeddings file", "run it")["ids"], torch.arange(5))
    path.write_bytes(path.read_bytes()[:100])  # truncated inside the header
    with pytest.raises(DataError, match=r"truncated or corrupt embeddings file \(.*\); run it"):
        load_tensors(path, "embeddings file", "run it")
