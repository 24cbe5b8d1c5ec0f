"""The model a user's torchrun code wrote, published as pipectl's own training publishes its own.

With ``train(module=..., exports_onnx=True)`` the user's code writes the trained model as ONNX
(``torch.onnx.export(model, example, path, dynamo=True)``, one input [N, C, H, W] of the
preprocessed images, one output of logits) to ``$PIPECTL_TRAIN_OUTPUTS_DIR/model.onnx`` on rank 0.
After torchrun ends with success, the launcher of node rank 0 checks the file (ONNX Runtime loads
it; its input takes [N, C, H, W]), logs it to the run's MLflow run (found again by the workflow
tag, as pipectl's training does) and writes the train output: evaluate and register then work
as after pipectl's own training.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from pipectl.components.contracts import RunLayout, StoreSettings, TrainInput, TrainOutput
from pipectl.components.runtime import StepError, s3_client, write_json

log = logging.getLogger("pipectl.train")

MODEL_FILE = "model.onnx"
ENV_PREFIX = "PIPECTL_TRAIN_"


def model_path() -> Path:
    return Path(os.environ.get(ENV_PREFIX + "OUTPUTS_DIR", "/tmp/outputs")) / MODEL_FILE


def _step_input() -> TrainInput:
    """The train step's inputs, from the environment contract (``PIPECTL_TRAIN_<FIELD>``)."""
    fields = {n: os.environ[ENV_PREFIX + n.upper()] for n in TrainInput.model_fields if ENV_PREFIX + n.upper() in os.environ}
    return TrainInput.model_validate(fields)


def _check(path: Path) -> None:
    import onnxruntime as ort

    if not path.is_file():
        raise StepError(f"train(exports_onnx=True): the training code ended with success but wrote no {path}",
                        "on rank 0, torch.onnx.export(model, example, os.environ['PIPECTL_TRAIN_OUTPUTS_DIR'] + '/model.onnx')")
    try:
        inputs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()
    except Exception as e:  # noqa: BLE001 - whatever ONNX Runtime refuses
        raise StepError(f"{path} is not a model ONNX Runtime loads: {str(e).splitlines()[0][:300]}",
                        "export it with torch.onnx.export") from e
    if len(inputs) != 1 or len(inputs[0].shape or []) != 4:
        raise StepError(f"{path}: the model takes {[(i.name, i.shape) for i in inputs]}, not one input [N, C, H, W]",
                        "evaluate feeds it the preprocessed images, batch first")


def publish(world_size: int, settings: StoreSettings | None = None) -> TrainOutput:
    """Check ``model.onnx``, log it to the run's MLflow run, write the train output (module doc)."""
    import mlflow
    import mlflow.onnx
    import onnx

    from pipectl.components.train.core import _mlflow_run

    path, inp = model_path(), _step_input()
    _check(path)
    settings = settings or StoreSettings()
    run = _mlflow_run(inp, settings)
    info = mlflow.onnx.log_model(onnx.load(str(path)), name="model", pip_requirements=["onnxruntime"])
    out = TrainOutput(mlflow_run_id=run.info.run_id, model_uri=info.model_uri, steps=0, steps_this_attempt=0,
                      resumed_from_step=0, world_size=world_size)
    write_json(s3_client(settings), RunLayout(run_uri=inp.run_uri).train_output_uri, out.model_dump(mode="json"))
    mlflow.end_run()
    log.info("published the training code's model %s as %s", path, info.model_uri)
    return out
