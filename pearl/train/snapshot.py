"""Weight snapshots: one safetensors folder per policy version, and a registry of them.

Life cycle: after each optimizer step the trainer calls ``write_snapshot(model, out_dir, version,
template_dir, metadata)``; it writes ``<out_dir>/v<version>/`` (``model.safetensors`` + the
template's config and tokenizer files) atomically (a ``.tmp`` folder renamed into place) and returns
a ``SnapshotRef``. The trainer registers the ref in the ``WeightRegistry``; rollout workers pull
lazily: a worker loads ``registry.latest()`` when it next syncs (``InferenceEngine.load_weights``),
and a new worker is admitted only after it reports the expected version
(``WeightRegistry.admit``).

The registry keeps version, metadata and paths only - never tensors. Versions are strictly
increasing; registering an older or duplicate version is an error (a stale trainer must not roll
the policy back).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Files copied from the template folder next to the weights (config, tokenizer, chat template).
TEMPLATE_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "vocab.json",
    "merges.txt",
)
WEIGHTS_FILE = "model.safetensors"
META_FILE = "pearl-snapshot.json"


class SnapshotError(RuntimeError):
    """A snapshot could not be written, found or registered; the message says which and why."""


@dataclass(frozen=True, slots=True)
class SnapshotRef:
    """A written snapshot: its version, folder, creation time (Unix s) and free-form metadata."""

    version: int
    path: str
    created_at: float
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "path": self.path, "created_at": self.created_at,
                "metadata": dict(self.metadata)}

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> SnapshotRef:
        return SnapshotRef(int(d["version"]), str(d["path"]), float(d["created_at"]), dict(d.get("metadata", {})))


class WeightRegistry:
    """Version -> ``SnapshotRef`` (paths and metadata only), strictly increasing versions."""

    def __init__(self, refs: tuple[SnapshotRef, ...] = ()) -> None:
        self._refs: dict[int, SnapshotRef] = {}
        for ref in refs:
            self.register(ref)

    def register(self, ref: SnapshotRef) -> None:
        if self._refs and ref.version <= max(self._refs):
            raise SnapshotError(
                f"snapshot version {ref.version} is not newer than the latest registered version "
                f"{max(self._refs)}; versions must increase (is a stale trainer writing?)")
        if not (Path(ref.path) / WEIGHTS_FILE).is_file():
            raise SnapshotError(f"snapshot v{ref.version}: {ref.path}/{WEIGHTS_FILE} does not exist")
        self._refs[ref.version] = ref

    def latest(self) -> SnapshotRef | None:
        return self._refs[max(self._refs)] if self._refs else None

    def get(self, version: int) -> SnapshotRef:
        try:
            return self._refs[version]
        except KeyError:
            raise SnapshotError(
                f"no snapshot for version {version}; registered: {self.versions() or 'none'}") from None

    def versions(self) -> list[int]:
        return sorted(self._refs)

    def admit(self, reported_version: int) -> bool:
        """A new worker joins the pool only once it reports the latest registered version."""
        latest = self.latest()
        return latest is None or reported_version == latest.version

    @staticmethod
    def scan(root: str | Path) -> WeightRegistry:
        """Rebuild a registry from the snapshot folders under ``root`` (after a restart)."""
        refs = []
        for meta in sorted(Path(root).glob(f"v*/{META_FILE}")):
            refs.append(SnapshotRef.from_dict(json.loads(meta.read_text())))
        return WeightRegistry(tuple(sorted(refs, key=lambda r: r.version)))


def _state_dict(model_or_state_dict: Any) -> dict[str, Any]:
    if isinstance(model_or_state_dict, Mapping):
        return dict(model_or_state_dict)
    if hasattr(model_or_state_dict, "state_dict"):
        return dict(model_or_state_dict.state_dict())
    raise SnapshotError(f"write_snapshot needs an nn.Module or a state dict, got {type(model_or_state_dict)!r}")


def write_snapshot(
    model_or_state_dict: Any,
    out_dir: str | Path,
    version: int,
    template_dir: str | Path,
    metadata: Mapping[str, Any] | None = None,
) -> SnapshotRef:
    """Write ``<out_dir>/v<version>/`` as a folder vLLM/SGLang/transformers can load.

    Tensors are stored contiguous, detached, on CPU, in their own dtype (bf16 for our models);
    tied parameters are written once per name (our models are untied, see ``pearl.models``).
    Config and tokenizer files come from ``template_dir`` (the base model folder).
    """
    import torch
    from safetensors.torch import save_file

    if version < 0:
        raise SnapshotError(f"snapshot version must be >= 0, got {version}")
    template = Path(template_dir)
    if not (template / "config.json").is_file():
        raise SnapshotError(f"template_dir {template} has no config.json (pass the base model folder)")
    state = _state_dict(model_or_state_dict)
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if not isinstance(t, torch.Tensor):
            raise SnapshotError(f"state dict entry {name!r} is a {type(t).__name__}, not a tensor")
        tensors[name] = t.detach().to("cpu").contiguous().clone()
    final = Path(out_dir) / f"v{version}"
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt", "pearl_version": str(version)})
    for fname in TEMPLATE_FILES:
        if (template / fname).is_file():
            shutil.copy2(template / fname, tmp / fname)
    ref = SnapshotRef(version=version, path=str(final.resolve()), created_at=time.time(),
                      metadata=dict(metadata or {}))
    (tmp / META_FILE).write_text(json.dumps(ref.to_dict(), indent=2, default=str) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return ref
