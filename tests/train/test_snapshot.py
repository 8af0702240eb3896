"""Weight snapshots: written folders load back bit-exactly; the registry keeps versions increasing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from pearl.train.snapshot import META_FILE, SnapshotError, SnapshotRef, WeightRegistry, write_snapshot


@pytest.fixture
def template(tmp_path: Path) -> Path:
    t = tmp_path / "base"
    t.mkdir()
    (t / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (t / "tokenizer.json").write_text("{}")
    return t


def test_write_snapshot_roundtrip(tmp_path: Path, template: Path) -> None:
    state = {"a.weight": torch.randn(3, 4).to(torch.bfloat16), "b.bias": torch.arange(5, dtype=torch.float32)}
    ref = write_snapshot(state, tmp_path / "snaps", 3, template, {"step": 7})
    folder = Path(ref.path)
    assert folder.name == "v3" and ref.version == 3 and ref.metadata == {"step": 7}
    loaded = load_file(str(folder / "model.safetensors"))
    assert set(loaded) == set(state)
    for k, v in state.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v)
    assert (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file()
    assert json.loads((folder / META_FILE).read_text())["version"] == 3
    assert not (tmp_path / "snaps" / "v3.tmp").exists()


def test_write_snapshot_from_module(tmp_path: Path, template: Path) -> None:
    model = torch.nn.Linear(2, 3)
    ref = write_snapshot(model, tmp_path, 0, template)
    loaded = load_file(str(Path(ref.path) / "model.safetensors"))
    assert torch.equal(loaded["weight"], model.weight.detach())


def test_write_snapshot_rejects_bad_input(tmp_path: Path, template: Path) -> None:
    with pytest.raises(SnapshotError, match=r"config\.json"):
        write_snapshot({"w": torch.zeros(1)}, tmp_path, 1, tmp_path / "nowhere")
    with pytest.raises(SnapshotError, match="not a tensor"):
        write_snapshot({"w": [1, 2]}, tmp_path, 1, template)
    with pytest.raises(SnapshotError, match=">= 0"):
        write_snapshot({"w": torch.zeros(1)}, tmp_path, -1, template)


def test_registry_versions_increase_and_scan(tmp_path: Path, template: Path) -> None:
    reg = WeightRegistry()
    assert reg.latest() is None and reg.admit(5)
    r1 = write_snapshot({"w": torch.zeros(2)}, tmp_path, 1, template)
    r2 = write_snapshot({"w": torch.ones(2)}, tmp_path, 2, template)
    reg.register(r1)
    reg.register(r2)
    assert reg.latest() == r2 and reg.get(1) == r1 and reg.versions() == [1, 2]
    assert reg.admit(2) and not reg.admit(1)
    with pytest.raises(SnapshotError, match="not newer"):
        reg.register(r1)
    with pytest.raises(SnapshotError, match="registered: \\[1, 2\\]"):
        reg.get(9)
    with pytest.raises(SnapshotError, match="does not exist"):
        WeightRegistry().register(SnapshotRef(4, str(tmp_path / "missing"), 0.0))
    again = WeightRegistry.scan(tmp_path)
    assert again.versions() == [1, 2] and again.latest() == r2
