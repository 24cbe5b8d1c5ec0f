"""The trained model as an ONNX graph: what is registered, and what evaluate scores.

Why ONNX: the registered model must be scored (champion against candidate) whatever its
architecture, in a step that has none of the training code, and loading it must not run code.
A pickled ``nn.Module`` (MLflow's pytorch flavour) needs its classes importable and unpickles
arbitrary objects; ``torch.export.load`` also unpickles constants. An ONNX file is a protobuf of
standard operators and tensors: ONNX Runtime runs it with nothing of the model's code, and serving
stacks (MLflow's ``onnx`` flavour, Triton, ONNX Runtime itself) take it as it is.

The graph takes ``images`` float32 [batch, channels, H, W] (batch dynamic) and returns ``logits``
float32 [batch, num_classes]. Models over 2 GB are written with their weights as external data
beside the graph (MLflow's default), which ONNX Runtime reads from the same folder.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import re
import tempfile
from functools import partial
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import nn

log = logging.getLogger("pipectl.models")

INPUT_NAME, OUTPUT_NAME = "images", "logits"
MODEL_NAME = "model"
"""Name of the logged model of a training run (``runs:/<id>/model``, ``models:/m-...``)."""
WEIGHTS_ARTIFACT = "weights"
"""Artifact folder of the training run: ``state_dict.pt`` (tensors only) and ``model.json`` (the
architecture's name and arguments), to fine-tune from in torch. Runs logged before the ONNX model
have only this; :func:`load_scorer` still scores their small-cnn from it (tensors only, no pickle)."""


class ExportError(ValueError):
    """The model cannot be written as ONNX; ``layer`` names the innermost submodule that fails."""

    def __init__(self, layer: str, kind: str, reason: str) -> None:
        self.layer = layer
        super().__init__(f"the model cannot be exported to ONNX: layer {layer!r} ({kind}) fails: {reason}")


def _export(module: nn.Module, args: tuple, kwargs: dict | None = None) -> Any:
    """``torch.onnx.export`` of ``module`` at ``args`` with a dynamic batch dimension; its progress
    lines are kept out of the step's log."""
    batch = torch.export.Dim("batch", min=1)
    shapes = tuple({0: batch} if isinstance(a, torch.Tensor) and a.dim() > 0 else None for a in args)
    for name in ("onnx_ir", "onnxscript"):  # their passes log each step at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    with contextlib.redirect_stdout(io.StringIO()):
        return torch.onnx.export(module, args, kwargs=kwargs, dynamo=True, dynamic_shapes=shapes,
                                 input_names=[INPUT_NAME], output_names=[OUTPUT_NAME], verbose=False)


def _inputs_of_children(model: nn.Module, example: torch.Tensor) -> dict[str, tuple[nn.Module, tuple, dict]]:
    """Each submodule's inputs during one forward pass of ``example`` (call order), by its name."""
    seen: dict[str, tuple[nn.Module, tuple, dict]] = {}
    hooks = []
    def record(name: str, module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.setdefault(name, (module, args, kwargs))

    for name, sub in model.named_modules():
        if name:
            hooks.append(sub.register_forward_pre_hook(partial(record, name), with_kwargs=True))
    try:
        with torch.no_grad():
            model(example)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _failing_layer(model: nn.Module, example: torch.Tensor) -> tuple[str, str, str] | None:
    """(name, class, reason) of the innermost submodule whose own export fails, or None."""
    calls = _inputs_of_children(model, example)
    culprit: tuple[str, str, str] | None = None
    prefix = ""
    while True:
        children = [n for n in calls if n.rpartition(".")[0] == prefix.rstrip(".") and n.startswith(prefix)]
        for name in children:
            module, args, kwargs = calls[name]
            try:
                _export(module, args, kwargs)
            except Exception as e:  # noqa: BLE001 - any failure localises the layer
                culprit = (name, type(module).__name__, _reason(e))
                break
        else:
            return culprit
        prefix = culprit[0] + "."


def _reason(e: BaseException) -> str:
    """The first line of an exporter's root error, without terminal colours."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _verify(proto: Any, model: nn.Module, example: torch.Tensor) -> None:
    """The graph computes what ``model`` computes, on a batch of another size and other values
    than the one it was traced at (an exporter that baked a branch or a shape in is caught here)."""
    import onnxruntime as ort

    probe = torch.cat([example, example.flip(0) * 0.5 + 0.25])
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: probe.numpy()})[0]
    with torch.no_grad():
        want = model(probe).numpy()
    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-3, atol=1e-4):
        raise ExportError("<model>", type(model).__name__, "the exported graph does not compute what the model does "
                          f"on a new batch (largest difference {np.abs(got - want).max() if got.shape == want.shape else got.shape})")


def export_onnx(model: nn.Module, example: torch.Tensor) -> Any:
    """``model`` (eval mode, on CPU) as an ``onnx.ModelProto`` traced at ``example`` [N>=2, C, H, W],
    checked against the model on a new batch. Raises :class:`ExportError` naming the layer that
    cannot be exported."""
    model = model.cpu().eval()
    example = example.cpu()
    try:
        proto = _export(model, (example,)).model_proto
    except Exception as e:  # noqa: BLE001 - reported with the layer it comes from
        found = _failing_layer(model, example)
        raise (ExportError("<model>", type(model).__name__, _reason(e)) if found is None else ExportError(*found)) from e
    _verify(proto, model, example)
    return proto


def log_model(model: nn.Module, example: torch.Tensor, architecture: str, num_classes: int, channels: int) -> str:
    """Log ``model`` to the active MLflow run as ONNX (the model registered and scored) and its
    weights (:data:`WEIGHTS_ARTIFACT`). Returns the logged model's URI."""
    import mlflow
    import mlflow.onnx

    proto = export_onnx(model, example)
    info = mlflow.onnx.log_model(proto, name=MODEL_NAME, pip_requirements=["onnxruntime"])
    with tempfile.TemporaryDirectory() as d:
        torch.save(model.state_dict(), Path(d) / "state_dict.pt")
        (Path(d) / "model.json").write_text(json.dumps({"architecture": architecture, "num_classes": num_classes,
                                                        "channels": channels}))
        mlflow.log_artifacts(d, artifact_path=WEIGHTS_ARTIFACT)
    return info.model_uri


Scorer = Callable[[np.ndarray], np.ndarray]
"""Logits float32 [N, num_classes] of images float32 [N, C, H, W]."""


def _onnx_scorer(path: Path, threads: int) -> Scorer:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda images: session.run(None, {name: np.ascontiguousarray(images, dtype=np.float32)})[0]


def _weights_scorer(folder: Path) -> Scorer:
    """A run logged before the ONNX model: its small-cnn rebuilt from tensors alone."""
    from pipectl.components.models.architectures import build_model

    spec = json.loads((folder / "model.json").read_text())
    name = {"SmallCNN": "small-cnn"}.get(spec.get("architecture"), spec.get("architecture"))
    model = build_model(str(name), int(spec["num_classes"]), int(spec["channels"]))
    model.load_state_dict(torch.load(folder / "state_dict.pt", map_location="cpu", weights_only=True))
    model.eval()

    def score(images: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return model(torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))).numpy()
    return score


def download_model(model_uri: str, folder: Path, *, tracking_uri: str | None = None) -> Path:
    """The logged model at ``model_uri``, downloaded under ``folder / "model"`` (what
    :func:`model_sha256` digests); its local path."""
    import mlflow.artifacts

    return Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=str(folder / "model"),
                                                    tracking_uri=tracking_uri))


def model_sha256(local: Path) -> str:
    """Digest of a downloaded logged model (a folder, or one file): sha256 over each file's path
    relative to it and its own sha256, in path order. Evaluate records it for what it scored;
    register compares it with what it is about to register."""
    import hashlib

    files = sorted(p for p in local.rglob("*") if p.is_file()) if local.is_dir() else [local]
    outer = hashlib.sha256()
    for p in files:
        inner = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                inner.update(chunk)
        rel = p.relative_to(local).as_posix() if local.is_dir() else p.name
        outer.update(f"{rel}\t{inner.hexdigest()}\n".encode())
    return outer.hexdigest()


def load_scorer(model_uri: str, run_id: str, folder: Path, *, tracking_uri: str | None = None, threads: int = 1) -> Scorer:
    """The scorer of a logged model: its ONNX graph (ONNX Runtime, no code of the model's), or for
    a run logged before it, the run's small-cnn weights. ``folder``: where to download to (kept
    while the scorer is used; the model itself in :func:`download_model`'s place)."""
    import mlflow.artifacts

    local = download_model(model_uri, folder, tracking_uri=tracking_uri)
    flavours = (local / "MLmodel").read_text() if (local / "MLmodel").exists() else ""
    onnx_files = sorted(local.glob("*.onnx"))
    if "onnx:" in flavours and onnx_files:
        return _onnx_scorer(onnx_files[0], threads)
    weights = Path(mlflow.artifacts.download_artifacts(run_id=run_id, artifact_path=WEIGHTS_ARTIFACT,
                                                       dst_path=str(folder / "weights"), tracking_uri=tracking_uri))
    return _weights_scorer(weights)


def predict(score: Scorer, images: np.ndarray, prepare: Callable[[np.ndarray], np.ndarray] = lambda x: x,
            batch_size: int = 256) -> np.ndarray:
    """Logits of ``images`` [N, C, H, W] through ``score``, in batches, each batch ``prepare``\ d
    first (e.g. ``ShardStream.model_input``: stored pixels to normalised float32)."""
    return np.concatenate([score(prepare(images[i:i + batch_size])) for i in range(0, len(images), batch_size)])
