"""A team's pipeline: pipectl's steps without the Alluxio warm-up, plus a step of the team's own
that writes a training report next to the model before evaluation.

    pipectl render examples/custom-pipeline/pipeline.py:pipeline
    pipectl run examples/custom-pipeline/pipeline.py:pipeline -p epochs=3
    pipectl templates apply examples/custom-pipeline/pipeline.py:pipeline   # on a cluster, then
    pipectl submit examples/custom-pipeline/pipeline.py:pipeline -p dataset-uri=s3://...
"""

from pipectl.sdk import RUN_URI, ContainerStep, Pipeline, evaluate, parameter, preprocess, register, stage, train

# The image is the team's, built FROM pipectl's light step image with this project installed
# (Dockerfile in this folder). `pipectl run` runs the command on this machine instead.
report = ContainerStep(
    "report",
    image="registry.example.com/ml/mysteps:0.1.0",
    command=["python", "-m", "mysteps.report"],
    args=["--run-uri", RUN_URI, "--model-name", parameter("model-name")],
    outputs=["report-uri"],
)

pipeline = Pipeline(
    "team-training",
    [stage(), preprocess(), train(), report, evaluate(), register()],
    title="Team training",
    description="Stage, preprocess, train, write a report, evaluate, register.",
)
