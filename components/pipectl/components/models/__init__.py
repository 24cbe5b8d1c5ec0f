"""Models the steps train, export and score: architectures by name, the portable (ONNX) model,
classification metrics. Kept outside any one step: ``train`` builds and logs a model,
``evaluate`` scores candidate and champion from their logged ONNX graphs."""

from pipectl.components.models.architectures import ARCHITECTURES, SmallCNN, build_model
from pipectl.components.models.metrics import classification_metrics, predict
from pipectl.components.models.portable import ExportError, download_model, export_onnx, load_scorer, log_model, model_sha256

__all__ = ["ARCHITECTURES", "ExportError", "SmallCNN", "build_model", "classification_metrics", "download_model",
           "export_onnx", "load_scorer", "log_model", "model_sha256", "predict"]
