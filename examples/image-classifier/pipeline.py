"""A team's image classifier: its own train function (a torchvision ResNet-18, shapes/train.py)
on its own 64x64 images, evaluated against the current champion whatever architecture that is
(both are registered as ONNX) by its own metric (balanced accuracy, shapes/metrics.py), and
registered. Its own hyper-parameters (weight decay, label smoothing, flips) are arguments of the
template beside pipectl's (shapes/parameters.py).

    python -m shapes.generate ./shapes-data --per-class 200        # the team's data
    pipectl run pipeline.py:pipeline -p dataset-uri=./shapes-data  # on this machine (imports shapes/ from here)
    docker build --build-arg BASE=registry.example.com/pipectl/step-train:0.1.0 \
        -t registry.example.com/ml/shapes:0.1.0 .                  # the team's image, FROM pipectl's train image
    pipectl templates apply pipeline.py:pipeline                   # on a cluster, then
    pipectl submit pipeline.py:pipeline -p dataset-uri=s3://team-data/shapes/

The image the train and evaluate steps run is IMAGE below, or $SHAPES_IMAGE when set (a build's
own tag, as CI deploys it): SHAPES_IMAGE=registry.example.com/ml/shapes:c-1a2b pipectl templates apply ...
"""

import os

from pipectl.sdk import Pipeline, evaluate, preprocess, register, stage, train
from shapes.parameters import ShapesParameters

# FROM pipectl's step-train image, with this project (Dockerfile)
IMAGE = os.environ.get("SHAPES_IMAGE") or "registry.example.com/ml/shapes:0.1.0"

pipeline = Pipeline(
    "shapes-training",
    [stage(), preprocess(), train(function="shapes.train:train", image=IMAGE),
     evaluate(metric="shapes.metrics:balanced_accuracy", image=IMAGE), register()],
    title="Shapes classifier",
    description="Stage the team's images, preprocess at 64x64, train the team's ResNet-18 as a gang, "
    "evaluate against the champion, register.",
    defaults={
        "image-size": 64,
        "epochs": 8,  # 80 steps at 200 images a class: ResNet-18's batch-norm statistics settle
        "learning-rate": 0.02,  # 0.05 with 60 images a class (18 steps) diverged: held-out accuracy at chance
        "model-name": "shapes-classifier",
        "promotion-threshold": 0.8,
    },
    parameters=ShapesParameters,  # the team's own: -p weight-decay=0.001, in the Argo UI too
)
