"""Pipelines as compositions of steps: what :mod:`pipectl.sdk` exports.

A :class:`Pipeline` is a name and an ordered list of steps. ``validate`` always runs first (it
parses every parameter inside the cluster before anything else runs); each step then runs after
the one before it (and, after an optional step such as ``warm``, after the one before that too).
pipectl's own steps (:func:`stage` … :func:`register`) pass data along: stage
makes the dataset's manifest, preprocess the shards, train the model, evaluate the decision that
register acts on; a step that needs data no earlier step makes is refused when the pipeline is
built, naming the step to add or move. A user's :class:`ContainerStep` can sit anywhere after
``validate`` and reads what it needs through :class:`Value` s (the run's folder in the store, the
shards, a parameter, an earlier step's output).

Pure (compile layer): :meth:`Pipeline.build` maps a :class:`CompileConfig` to a Hera
``WorkflowTemplate`` named ``<pipeline>-v1``; the CLI renders, submits and runs that one object.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from hera.workflows import DAG, Parameter, Task, WorkflowTemplate
from pydantic import ValidationError

from pipectl.components.contracts import RunLayout, TrainingParameters
from pipectl.components.pipeline_parameters import ParameterSpec, parameter_model, specs_from_class
from pipectl.components.names import kebab
from pipectl.pipelines import training as t
from pipectl.pipelines.launchers.base import TRAIN_STEP_INPUTS
from pipectl.pipelines.training import CompileConfig

_NAME = re.compile(r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?$")
_PARAMETER = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
RESERVED_TEMPLATES = frozenset({"validate", "stage", "warm", "preprocess", "shards", "train", "train-retry", "train-backoff",
                                "train-wait", "train-reroute", "gang-avoid", "evaluate", "register", "gang-release"})
"""Template names of pipectl's steps: a user step or a pipeline may not take one of them."""


class PipelineError(ValueError):
    """A pipeline definition that cannot be built: ``message`` names the step, ``hint`` the fix."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message, hint)
        self.message, self.hint = message, hint

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


# -- values a step reads ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Value:
    """A value known when the workflow runs, for a :class:`ContainerStep`'s ``args`` or ``env``.

    Use the constants and functions of :mod:`pipectl.sdk` (``RUN_URI``, ``SHARDS_URI``,
    ``MANIFEST_URI``, ``WORKFLOW_NAME``, ``parameter(name)``, ``output(step, name)``), not this
    class. ``name`` is the step's input parameter that carries it (shown in the Argo UI)."""

    name: str
    needs: str | None = None
    """The data an earlier step must make (``manifest``, ``shards``, ``model``), or None."""
    source: tuple[str, ...] = ()


MANIFEST, SHARDS, MODEL, DECISION = "manifest", "shards", "model", "decision"
USER_MODEL = "model of your training code"
RUN_URI = Value("run-uri", None, ("run",))
"""The run's folder in the store, one per workflow (:class:`pipectl.components.contracts.RunLayout`):
the shards, the checkpoints, the trained model and what train and evaluate report."""
SHARDS_URI = Value("shards-uri", SHARDS, ("data", SHARDS))
"""The preprocessed shards (in the run's folder, with their index); needs preprocess."""
MANIFEST_URI = Value("manifest-uri", MANIFEST, ("data", MANIFEST))
"""The staged dataset's manifest (JSON lines: key, size, sha256, label); needs stage."""
WORKFLOW_NAME = Value("workflow-name", None, ("workflow", "name"))
"""The workflow's name (unique per run)."""


def parameter(name: str) -> Value:
    """A workflow parameter by its kebab name: pipectl's (``parameter("model-name")``) or one the
    pipeline declares in its ``parameters`` class (``parameter("weight-decay")``)."""
    if not isinstance(name, str) or not _PARAMETER.match(name):
        raise PipelineError(f"parameter({name!r}): a parameter's kebab-case name, e.g. parameter('model-name')")
    return Value(name, None, ("parameter", name))


def output(step: str, name: str) -> Value:
    """Output ``name`` of an earlier :class:`ContainerStep` ``step`` (declared in its ``outputs``)."""
    return Value(f"{step}-{name}", None, ("output", step, name))


# -- steps -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Context:
    """What a step's arguments are built from: the config, the run's layout, and which task made
    each piece of data and each output so far."""

    cfg: CompileConfig
    run: RunLayout
    makers: dict[str, str]
    outputs: dict[str, set[str]]

    def resolve(self, v: Value, where: str) -> str:
        kind = v.source[0]
        if kind == "run":
            return self.run.run_uri
        if kind == "workflow":
            return "{{workflow.name}}"
        if kind == "parameter":
            declared = {kebab(f) for f in parameter_model(self.cfg.pipeline_parameters).model_fields}
            if v.source[1] not in declared:
                raise PipelineError(f"{where}: reads parameter({v.source[1]!r}), which the pipeline does not declare",
                                    "declare it in the pipeline's parameters class (Pipeline(..., parameters=MyParameters)); "
                                    f"pipectl's own: {', '.join(sorted(kebab(f) for f in TrainingParameters.model_fields))}")
            return _wf(v.source[1])
        if kind == "data":
            return _out(self.makers[v.source[1]], DATA_OUTPUT[v.source[1]])
        step, name = v.source[1], v.source[2]
        if name not in self.outputs.get(step, set()):
            raise PipelineError(f"{where}: reads output {name!r} of step {step!r}, but no earlier step "
                                f"{step!r} declares it (outputs=[{name!r}] on a ContainerStep before it)")
        return _out(step, name)


DATA_OUTPUT = {MANIFEST: "manifest_uri", SHARDS: "shards_uri"}
"""Output parameter of the step that makes each piece of data (its field name)."""


def _wf(name: str) -> str:
    return "{{workflow.parameters.%s}}" % kebab(name)


def _out(task: str, name: str) -> str:
    return "{{tasks.%s.outputs.parameters.%s}}" % (task, kebab(name))


@dataclass(frozen=True)
class Step:
    """One of pipectl's own steps; make them with :func:`stage`, :func:`preprocess`, … ."""

    name: str
    needs: tuple[str, ...]
    makes: tuple[str, ...]
    templates: Callable[[CompileConfig], list]
    arguments: Callable[[_Context], dict[str, str]]
    when: Callable[[_Context], str | None] = lambda ctx: None


def _validate() -> Step:
    return Step("validate", (), (), t.validate_templates,
                lambda ctx: {n: _wf(n) for n in parameter_model(ctx.cfg.pipeline_parameters).model_fields})


def stage() -> Step:
    """Copy the dataset (``dataset-uri``: a local folder, ``s3://`` prefix or a bundled example)
    into the store under a content-addressed prefix with a manifest. Makes: the manifest."""
    return Step("stage", (), (MANIFEST,), t.stage_templates, lambda ctx: {"source_uri": _wf("dataset_uri")})


def warm() -> Step:
    """Load the staged dataset into Alluxio when the run's ``warm-cache`` is true (skipped
    otherwise). Needs: stage."""
    return Step("warm", (MANIFEST,), (), t.warm_templates,
                lambda ctx: {"manifest_uri": ctx.resolve(MANIFEST_URI, "warm")},
                when=lambda ctx: f"{_wf('warm_cache')} == true")


def preprocess() -> Step:
    """Decode and resize with DALI (GPU decode when there is a GPU) into train and validation
    shards of uint8 pixels in the run's folder (train and evaluate normalise them); corrupt images
    quarantined. Needs: stage. Makes: shards."""
    return Step("preprocess", (MANIFEST,), (SHARDS,), t.preprocess_templates, lambda ctx: {
        "manifest_uri": ctx.resolve(MANIFEST_URI, "preprocess"), "output_uri": ctx.run.shards_uri,
        **{n: _wf(n) for n in ("image_size", "validation_fraction", "max_corrupt_fraction")}})


def shards() -> Step:
    """Use ``dataset-uri`` as shards you already have, in place of stage and preprocess: an
    ``s3://`` folder with ``index.json`` and the ``.npz`` shards it lists, in preprocess's format
    (:mod:`pipectl.components.prebuilt`). The step checks them before any gang starts. Makes: shards."""
    return Step("shards", (), (SHARDS,), t.prebuilt_templates, lambda ctx: {"shards_uri": _wf("dataset_uri")})


def train(module: str | None = None, *, function: str | None = None, script: str | None = None,
          args: Sequence[str] = (), image: str | None = None, exports_onnx: bool = False) -> Step:
    """Train as one gang (Volcano Job or PyTorchJob: all workers start together or none), with the
    run's infrastructure retries, under ``torchrun`` (rank and world size in ``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``; gloo on CPU, nccl on GPU). Needs: preprocess. Makes: the model.

    Three levels of your own code:

    - ``train()``: pipectl's train function (the ``architecture`` parameter's model:
      :mod:`pipectl.components.train.builtin`).
    - ``train(function="mypkg.train:train")``: your train function, ``def train(ctx: TrainContext) ->
      nn.Module``, in ``image`` (built FROM pipectl's train step image; default: that image). It
      gets the gang, the data, resume and checkpoint-then-yield from ``ctx`` and returns the trained
      model; pipectl registers it as ONNX, so ``evaluate()`` and ``register()`` work as for its own.
    - ``train("mypkg.train")`` (``module=``, or ``script="train.py"``) and ``args``: any
      torchrun-compatible code. It reads the step's inputs from the environment:
      ``PIPECTL_TRAIN_SHARDS_URI``, ``PIPECTL_TRAIN_RUN_URI`` (the run's folder),
      ``PIPECTL_TRAIN_CHECKPOINTS_URI`` (``<run>/checkpoints/``, the same for every attempt of the
      run: write checkpoints there and resume from the newest at start, so a restarted gang
      carries on), ``PIPECTL_TRAIN_EPOCHS``, ``PIPECTL_TRAIN_BATCH_SIZE``, ``PIPECTL_TRAIN_LEARNING_RATE``,
      ``PIPECTL_TRAIN_CHECKPOINT_EVERY_STEPS``, ``PIPECTL_TRAIN_SEED``, ``PIPECTL_TRAIN_MODEL_NAME``,
      ``PIPECTL_TRAIN_WORKFLOW_NAME``, and the store's settings (``PIPECTL_S3_*``,
      ``PIPECTL_MLFLOW_URI``; the run's MLflow run is the one in experiment
      ``$PIPECTL_TRAIN_MODEL_NAME`` tagged ``pipectl.workflow=$PIPECTL_TRAIN_WORKFLOW_NAME``, which
      pipectl creates, or finds, when it publishes the model after training). Exit 0 when done, 75 for a transient failure worth restarting the gang
      for; any other exit ends the run as a failure of the code, except an infrastructure fault your
      entry point records with torch's ``@record`` (a GPU hardware error, a collective timeout: the
      gang restarts; :mod:`pipectl.components.train.faults`). With ``exports_onnx=True`` rank 0
      writes the trained model to ``$PIPECTL_TRAIN_OUTPUTS_DIR/model.onnx`` and pipectl registers
      it (:mod:`pipectl.components.train.publish`): ``evaluate()`` and ``register()`` can follow.
      Without it, follow your training with your own evaluation step."""
    entry, ref = _train_code(function, module, script, args, image)
    if exports_onnx is not False and (exports_onnx is not True or not entry):
        raise PipelineError(f"train(exports_onnx={exports_onnx!r}): True or False, and only with module= or script=",
                            "a train function's model is published by pipectl already")
    makes = (MODEL,) if not entry or exports_onnx else (USER_MODEL,)
    return Step("train", (SHARDS,), makes, lambda cfg: t.train_templates(cfg, entry, image, ref, exports_onnx),
                lambda ctx: {"shards_uri": ctx.resolve(SHARDS_URI, "train"), "run_uri": ctx.run.run_uri,
                             **{n: _wf(n) for n in TRAIN_STEP_INPUTS if n not in ("shards_uri", "run_uri")}})


_MODULE = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"


def _train_code(function: str | None, module: str | None, script: str | None, args: Sequence[str],
                image: str | None) -> tuple[tuple[str, ...], str]:
    """(torchrun target, train function reference) of :func:`train`'s arguments; PipelineError naming a bad one."""
    if sum(x is not None for x in (function, module, script)) > 1:
        raise PipelineError("train(): give module= or script=, not both" if function is None else
                            "train(): give function= (a train function) or module=/script= (your own torchrun code), not both")
    if function is not None and not re.fullmatch(_MODULE + r":[A-Za-z_][A-Za-z0-9_]*", str(function)):
        raise PipelineError(f"train(function={function!r}): not a train function reference (module.path:name)",
                            "e.g. train(function='mypkg.train:train')")
    if module is not None and not re.fullmatch(_MODULE, str(module)):
        raise PipelineError(f"train(module={module!r}): not a Python module name", "e.g. train(module='mypkg.train')")
    if script is not None and (not isinstance(script, str) or not script.strip() or script.startswith("-")):
        raise PipelineError(f"train(script={script!r}): not a script path", "e.g. train(script='train.py')")
    if isinstance(args, str) or not all(isinstance(a, str) for a in args):
        raise PipelineError(f"train(args={args!r}): a list of strings", "e.g. args=['--arch', 'resnet18']")
    if image is not None and (not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image)):
        raise PipelineError(f"train(image={image!r}): not an image reference", "e.g. registry.example.com/me/train:1.0")
    entry = (("-m", module) if module else (script,) if script else ()) + (tuple(args) if (module or script) else ())
    if args and not entry:
        raise PipelineError("train(args=...) needs module= or script=: a train function takes the run's parameters")
    if function is not None:
        _check_reference(function, f"train(function={function!r})", 1, "a train function takes one argument, the TrainContext",
                         f"def {function.partition(':')[2]}(ctx: TrainContext) -> torch.nn.Module")
    return entry, function or ""


def _check_reference(ref: str, call: str, arity: int, what: str, example: str) -> None:
    """When the module of ``ref`` (``module.path:name``) imports here (it may exist only in the
    step's image, or need torch where only the light install is), check the function takes
    ``arity`` arguments. ``call``: how the user wrote it, for messages."""
    import importlib
    import importlib.util
    import inspect

    module_name, _, attr = ref.partition(":")
    try:
        found = importlib.util.find_spec(module_name) is not None
        fn = getattr(importlib.import_module(module_name), attr, None) if found else None
    except ImportError:
        return  # its dependencies are in the image only
    except Exception as e:  # noqa: BLE001 - the user's module: name it and its error
        raise PipelineError(f"{call}: importing {module_name} failed: {type(e).__name__}: {e}") from e
    if found and fn is None:
        raise PipelineError(f"{call}: {module_name} has no {attr!r}", f"define {example} in {module_name}")
    if fn is not None:
        try:
            inspect.signature(fn).bind(*([object()] * arity))
        except (TypeError, ValueError):
            raise PipelineError(f"{call}: {what}", example) from None


def evaluate(metric: str | None = None, *, image: str | None = None) -> Step:
    """Score the trained model and the current ``champion`` on the held-out shards (both ONNX,
    whatever their architectures); decide promote/keep by ``promotion-metric`` and
    ``promotion-threshold``. Needs: train. Makes: the decision.

    ``metric="mypkg.metrics:balanced_accuracy"``: your metric decides instead of ``promotion-metric``:
    ``def balanced_accuracy(logits: np.ndarray, labels: np.ndarray) -> float`` (logits float32
    [N, classes], labels int64 [N]; higher is better, in [0, 1] as ``promotion-threshold`` is), in
    ``image`` (built FROM pipectl's light step image with your package; default: that image)."""
    if metric is not None and not re.fullmatch(_MODULE + r":[A-Za-z_][A-Za-z0-9_]*", str(metric)):
        raise PipelineError(f"evaluate(metric={metric!r}): not a metric function reference (module.path:name)",
                            "e.g. evaluate(metric='mypkg.metrics:balanced_accuracy')")
    if image is not None and (not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image)):
        raise PipelineError(f"evaluate(image={image!r}): not an image reference", "e.g. registry.example.com/me/eval:1.0")
    if metric is not None:
        _check_reference(metric, f"evaluate(metric={metric!r})", 2, "a metric takes two arguments, logits and labels",
                         f"def {metric.partition(':')[2]}(logits: np.ndarray, labels: np.ndarray) -> float")
    return Step("evaluate", (SHARDS, MODEL), (DECISION,), lambda cfg: t.evaluate_templates(cfg, metric or "", image),
                lambda ctx: {"shards_uri": ctx.resolve(SHARDS_URI, "evaluate"), "run_uri": ctx.run.run_uri,
                             **{n: _wf(n) for n in ("model_name", "promotion_metric", "promotion_threshold")}})


def register() -> Step:
    """Register one MLflow model version per run (a retried step finds its own) and move the
    ``champion`` alias when evaluate promoted it. Needs: evaluate."""
    return Step("register", (DECISION,), (), t.register_templates, lambda ctx: {
        "model_name": _wf("model_name"), "run_key": "{{workflow.uid}}", "promotion_metric": _wf("promotion_metric"),
        **{n: _out(ctx.makers[DECISION], n) for n in EVALUATION_HANDED_OVER}})


EVALUATION_HANDED_OVER = ("mlflow_run_id", "model_uri", "model_sha256", "decision", "metric", "metric_name", "champion_version",
                          "evaluation_set", "evaluation_set_sha256")
"""Evaluate's outputs register takes as its inputs (:class:`~pipectl.components.contracts.RegisterInput`)."""


@dataclass(frozen=True)
class ContainerStep:
    """A step of your own: ``command`` + ``args`` in ``image``, e.g. export to ONNX or notify.

    ``args`` and ``env`` values are strings or :class:`Value` s (resolved when the workflow runs).
    Write an output ``x`` (declared in ``outputs``) to ``$PIPECTL_OUTPUTS_DIR/x`` (``/tmp/outputs/x`` in
    the pod); later steps read it with
    ``output(<this step>, "x")``. ``store_access``: the store's settings in the environment
    (``PIPECTL_S3_ENDPOINT``, ``PIPECTL_S3_ACCESS_KEY``, ``PIPECTL_S3_SECRET_KEY``, ``PIPECTL_S3_REGION``,
    ``PIPECTL_BUCKET``, ``PIPECTL_MLFLOW_URI``). ``cpu`` (cores) and
    ``memory_gib`` (GiB) are requests; default: the site's step defaults. With ``pipectl run`` the
    command runs on this machine (``python`` is pipectl's interpreter; the image is not used)::

        ContainerStep("export-onnx", image="registry.example.com/me/export:1.0",
                      command=["python", "-m", "mypkg.export"], args=["--run-uri", RUN_URI])
    """

    name: str
    image: str
    command: Sequence[str]
    args: Sequence[str | Value] = ()
    env: dict[str, str | Value] = field(default_factory=dict)
    outputs: Sequence[str] = ()
    store_access: bool = True
    cpu: float | None = None
    memory_gib: float | None = None

    def check(self) -> None:
        where = f"step {self.name!r}"
        if not isinstance(self.image, str) or not self.image.strip():
            raise PipelineError(f"{where}: image is empty", "set image= to the image the step runs in")
        if isinstance(self.command, str) or not self.command or not all(isinstance(c, str) and c for c in self.command):
            raise PipelineError(f"{where}: command must be a non-empty list of strings (got {self.command!r})",
                                "e.g. command=['python', '-m', 'mypkg.export']")
        for a in [*self.args, *self.env.values()]:
            if not isinstance(a, (str, Value)):
                raise PipelineError(f"{where}: argument {a!r} is a {type(a).__name__}", "pass strings or pipectl.sdk values")
        for o in self.outputs:
            if not _NAME.match(o):
                raise PipelineError(f"{where}: output name {o!r} is not a lower-case name (a-z, 0-9, -)")
        for k in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                raise PipelineError(f"{where}: environment variable name {k!r} is not valid")


def _container_task(step: ContainerStep, ctx: _Context) -> tuple[list, dict[str, str]]:
    """The step's template and its task arguments: each Value becomes an input parameter."""
    where = f"step {step.name!r}"
    values = [v for v in [*step.args, *step.env.values()] if isinstance(v, Value)]
    inputs = list(dict.fromkeys(v.name for v in values))
    arguments = {v.name: ctx.resolve(v, where) for v in values}

    def text(v: str | Value) -> str:
        return "{{inputs.parameters.%s}}" % v.name if isinstance(v, Value) else v

    template = t.user_container_template(
        ctx.cfg, step.name, step.image, list(step.command), [text(a) for a in step.args], inputs, list(step.outputs),
        {k: text(v) for k, v in step.env.items()}, step.store_access, step.cpu, step.memory_gib)
    return [template], arguments


# -- the pipeline ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Pipeline:
    """A training pipeline: ``name`` (lower-case, the WorkflowTemplate is ``<name>-v1``) and its
    steps in order, after ``validate``, which always runs first::

        from pipectl.sdk import Pipeline, stage, preprocess, train, evaluate, register
        pipeline = Pipeline("my-training", [stage(), preprocess(), train(), evaluate(), register()])

    Every pipeline takes pipectl's typed parameters (``pipectl render training --help`` lists
    them); ``defaults`` sets this pipeline's own default values (what the Argo UI, ``pipectl run``
    and ``pipectl submit`` start from; ``-p`` still overrides them)::

        Pipeline("shapes", [...], defaults={"architecture": "resnet18", "image-size": 64})

    ``parameters`` adds parameters of the pipeline's own (a :class:`~pipectl.sdk.Parameters`
    class): arguments of the WorkflowTemplate like pipectl's, checked by ``validate``, read in the
    gang with ``MyParameters.from_env()`` and by a ContainerStep with ``parameter(name)``::

        class ShapesParameters(Parameters):
            weight_decay: float = Field(0.0001, ge=0, le=1, description="L2 penalty of the optimiser.")

        Pipeline("shapes", [...], parameters=ShapesParameters)"""

    name: str
    steps: Sequence[Step | ContainerStep]
    title: str = ""
    description: str = ""
    defaults: Mapping[str, str | int | float | bool] = field(default_factory=dict)
    parameters: type | None = None

    def parameter_specs(self) -> tuple[ParameterSpec, ...]:
        """The pipeline's own parameters as data (:class:`ParameterSpec`); PipelineError naming a
        field that cannot be one."""
        if self.parameters is None:
            return ()
        try:
            return specs_from_class(self.parameters)
        except ValueError as e:
            raise PipelineError(f"pipeline {self.name!r}: parameters: {e}") from None

    def parameter_model(self) -> type[TrainingParameters]:
        """pipectl's parameters and the pipeline's own, as one model."""
        return parameter_model(self.parameter_specs())

    def run_parameters(self, overrides: Mapping[str, str] | None = None) -> TrainingParameters:
        """The run's parameters: this pipeline's ``defaults``, then ``overrides`` (``-p``). Raises
        ValueError (an unknown name) or pydantic's ValidationError (a bad value)."""
        return self.parameter_model().from_overrides({**self.default_arguments(), **(overrides or {})})

    def default_arguments(self) -> dict[str, str]:
        """``defaults`` as argument text by kebab-case name (booleans ``true``/``false``). A pipeline
        that sets no ``model-name`` registers under its own name, so two teams' pipelines never
        share one champion by accident."""
        if not isinstance(self.defaults, Mapping):
            raise PipelineError(f"pipeline {self.name!r}: defaults must be a mapping of parameter name to value "
                                f"(got {type(self.defaults).__name__})", "e.g. defaults={'architecture': 'resnet18'}")
        own = {kebab(str(k)): ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in self.defaults.items()}
        return {"model-name": self.name, **own}

    def check(self) -> None:
        """Raise :class:`PipelineError` naming what is wrong: a bad name, two steps with one name,
        a step before the data it needs, an unknown kind of step."""
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name in RESERVED_TEMPLATES:
            raise PipelineError(f"pipeline name {self.name!r} must be lower-case letters, digits and '-' (at most 40), "
                                f"not one of pipectl's step names")
        self.parameter_specs()
        try:
            self.run_parameters()
        except ValueError as e:
            problem = _first_error(e) if isinstance(e, ValidationError) else str(e).splitlines()[0]
            raise PipelineError(f"pipeline {self.name!r}: defaults: {problem}",
                                "defaults take the pipeline's parameter names (`pipectl render training` lists them) "
                                "and values of their types") from None
        seen: set[str] = {"validate"}
        made: set[str] = set()
        for i, step in enumerate(self.steps):
            if not isinstance(step, (Step, ContainerStep)):
                raise PipelineError(f"step {i + 1} of pipeline {self.name!r} is a {type(step).__name__}, not a step",
                                    "use pipectl.sdk's stage(), preprocess(), ... or ContainerStep(...)")
            if step.name in seen or step.name == self.name:
                raise PipelineError(f"two steps named {step.name!r} in pipeline {self.name!r}", "give each step its own name")
            if isinstance(step, ContainerStep):
                if not _NAME.match(step.name) or step.name in RESERVED_TEMPLATES:
                    raise PipelineError(f"step name {step.name!r}: lower-case letters, digits and '-' (at most 40), "
                                        f"not one of pipectl's step names ({', '.join(sorted(RESERVED_TEMPLATES))})")
                step.check()
                needs = {v.needs for v in [*step.args, *step.env.values()] if isinstance(v, Value) and v.needs}
            else:
                needs = set(step.needs)
            if MODEL in needs and USER_MODEL in made:
                raise PipelineError(f"step {step.name!r} scores the model pipectl's own training code writes, but train() "
                                    f"in pipeline {self.name!r} runs your code",
                                    "write model.onnx and declare it: train(module=..., exports_onnx=True); or follow "
                                    "your training with your own evaluation step (a ContainerStep)")
            for need in sorted(needs - made):
                maker, other = _MAKER[need], _OR_ELSE.get(need)
                raise PipelineError(f"step {step.name!r} needs the {need} that {maker}{f' (or {other})' if other else ''} makes, "
                                    "and no step before it does",
                                    f"put {maker}(){f' (or {other}())' if other else ''} before {step.name!r} in pipeline {self.name!r}")
            seen.add(step.name)
            made.update(step.makes if isinstance(step, Step) else ())

    def build(self, cfg: CompileConfig | None = None) -> WorkflowTemplate:
        """The compiled WorkflowTemplate ``<name>-v1`` for ``cfg`` (defaults when None)."""
        self.check()
        cfg = (cfg or CompileConfig()).model_copy(update={"pipeline_parameters": self.parameter_specs()})
        ctx = _Context(cfg, RunLayout.under(cfg.store_root(), "{{workflow.name}}"), {}, {})
        tasks: list[Task] = []
        templates: list = []
        after: list[str] = []  # what the next step depends on
        for step in [_validate(), *self.steps]:
            if isinstance(step, ContainerStep):
                step_templates, args = _container_task(step, ctx)
                when = None
                ctx.outputs[step.name] = set(step.outputs)
            else:
                step_templates, args, when = step.templates(cfg), step.arguments(ctx), step.when(ctx)
                ctx.makers.update({d: step.name for d in step.makes})
            tasks.append(Task(name=step.name, template=step_templates[0], dependencies=after or None,
                              when=when, arguments=[Parameter(name=kebab(k), value=v) for k, v in args.items()]))
            templates += step_templates
            # after the step before; after an optional step (a `when`) also after what it followed,
            # as the DAG reads then (Argo runs a task whose dependency was skipped either way)
            after = [*after, step.name] if when else [step.name]
        title = self.title or f"{self.name} pipeline"
        description = self.description or " → ".join(["validate", *(s.name for s in self.steps)])
        return t.workflow_template(cfg, self.name, title, description, DAG(name=self.name, tasks=tasks), templates,
                                   self.run_parameters().as_arguments())


def _first_error(e: ValidationError) -> str:
    """``name: message (got value)`` of a pydantic error's first problem."""
    err = e.errors()[0]
    return f"{'.'.join(str(x).replace('_', '-') for x in err['loc'])}: {err['msg']} (got {err.get('input')!r})"


_MAKER = {MANIFEST: "stage", SHARDS: "preprocess", MODEL: "train", DECISION: "evaluate"}
_OR_ELSE = {SHARDS: "shards"}
"""Another of pipectl's steps that makes the same data (shards you already have)."""
