"""Contracts shared by every layer: parameters, step inputs/outputs, exit codes, settings.

pydantic models only (docs/architecture.md, "Layers"). No I/O at import time.
"""

from __future__ import annotations

import decimal
import enum
import json
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipectl.components.names import (  # noqa: F401 - names the steps use, re-exported
    LANE_OBJECT_PREFIX,
    OUTPUTS_DIR,
    Lane,
    kebab,
    lane_object_name,
    snake,
)


class ExitCode(enum.IntEnum):
    """Step exit codes (docs/pipelines.md lists them for a team's own step).

    ``TEMPFAIL`` is 75, ``EX_TEMPFAIL`` from BSD ``sysexits.h``: a transient failure worth retrying.
    ``AVOID_NODES`` is 76, the gang preflight's slow link: the infrastructure's, and the gang's next
    attempt is placed away from the nodes its termination message names (:data:`AVOID_NODES_MARK`).
    """

    OK = 0
    FAILED = 1
    TEMPFAIL = 75
    AVOID_NODES = 76


AVOID_NODES_MARK = "avoid nodes: "
"""How a gang pod that exits :attr:`ExitCode.AVOID_NODES` names the nodes to avoid in its
termination message: one line ``avoid nodes: node-a,node-b``."""
NODE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
"""A Kubernetes node name (a DNS subdomain)."""


class PromotionMetric(str, enum.Enum):
    """Held-out metric used to decide promotion; higher is better for every member."""

    accuracy = "accuracy"
    f1_macro = "f1_macro"


class Architecture(str, enum.Enum):
    """Architectures pipectl's own training builds (components/pipectl/components/models/architectures.py).
    torchvision's are built without downloaded weights."""

    small_cnn = "small-cnn"
    resnet18 = "resnet18"
    resnet50 = "resnet50"


class Decision(str, enum.Enum):
    promote = "promote"
    keep = "keep"


DEFAULT_SHARD_MIB = 256
"""Most MiB of images per shard unless a run says otherwise: ~1,780 images at 224x224 (uint8), so
a training process's data memory (about four shards) stays near 1 GiB whatever the dataset's size."""
SINGLE_PUT_MAX_MIB = 5 * 1024
"""The most one PUT may write: 5 GiB on S3 (AWS S3 docs, "Uploading objects": one PUT up to 5 GB) and
on Ceph RGW (``rgw_max_put_size``, 5 GiB by default). preprocess writes each shard with one PUT."""
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
_MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_INT_TEXT = re.compile(r"0|[1-9][0-9]*")
_DECIMAL_TEXT = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?")
NUMBER_TEXT_MAX = 18
"""The most characters of a number parameter's text: every one within its bounds fits, and the gang
job's check of its parameters (Argo's sprig.atoi, a 64-bit integer) reads no longer text."""
_LINE_SEPARATORS = "\x85\u2028\u2029"
"""Characters YAML 1.1 (PyYAML, and Kubernetes' YAML reader) takes as line breaks besides LF/CR."""


class StrictModel(BaseModel):
    """Base for contracts: unknown fields are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, use_enum_values=False)


class CanonicalModel(StrictModel):
    """Base of the contracts that read a run's parameters as text (``validate``, the gang's train
    step): every value in the one spelling all of its readers agree on."""

    @field_validator("*", mode="before")
    @classmethod
    def _plain_text(cls, v: Any, info: ValidationInfo) -> Any:
        # Argo substitutes values as text into manifests and commands (C15): no value may carry a
        # control character (newline, tab, CR...), a line separator YAML reads as a line break, or
        # surrounding whitespace, which pydantic would otherwise strip from numbers while the raw
        # text still reaches the manifest; nor an Argo tag, which a later substitution pass would
        # evaluate. And a value is accepted only in the one spelling that validate, YAML, Argo's
        # expressions and torchrun all read alike (C22): `010` is 10 here but 8 to YAML 1.1.
        if not isinstance(v, str):
            return v
        if v != v.strip() or any(ord(c) < 32 or ord(c) == 127 or c in _LINE_SEPARATORS for c in v):
            raise ValueError("must be plain text: no control characters, line separators or surrounding whitespace")
        if "{{" in v or "}}" in v:
            raise ValueError("must not contain '{{' or '}}': Argo would read an expression in it")
        kind = cls.model_fields[info.field_name].annotation if info.field_name else None
        if kind is bool and v not in ("true", "false"):
            raise ValueError(f"{v!r}: write true or false (lower case; Argo's `when` compares the text)")
        if kind is int and not _INT_TEXT.fullmatch(v):
            raise ValueError(f"{v!r} is not a plain integer: digits only, no sign, leading zero, '_' or '.' (e.g. 10)")
        if kind is float and not _DECIMAL_TEXT.fullmatch(v):
            raise ValueError(f"{v!r} is not a plain decimal: digits with an optional fraction, no sign, exponent, "
                             "'_' or leading zero (e.g. 0.002)")
        if kind in (int, float) and len(v) > NUMBER_TEXT_MAX:
            raise ValueError(f"{v!r} is longer than {NUMBER_TEXT_MAX} characters")
        step = next((m.multiple_of for m in cls.model_fields[info.field_name].metadata
                     if hasattr(m, "multiple_of")), None) if kind is float else None
        if step is not None and len(v.partition(".")[2]) > -decimal.Decimal(str(step)).normalize().as_tuple().exponent:
            raise ValueError(f"{v!r} has more decimals than a multiple of {step} needs")
        return v

    @field_validator("model_name", check_fields=False)
    @classmethod
    def _model_name(cls, v: str) -> str:
        if not _MODEL_NAME.fullmatch(v):  # fullmatch: `$` alone lets a trailing newline through (C15)
            raise ValueError("model name must be 1-100 of letters, digits, '.', '_', '-', starting alphanumeric")
        return v


class GangShape(CanonicalModel):
    """The training gang's shape: what a launcher's job manifest takes besides :class:`TrainInput`
    (the train step's inputs are these fields and TrainInput's). Field definitions are written
    here once; :class:`TrainingParameters` takes them as they are."""

    workers: int = Field(1, ge=1, le=1024, description="Pods in the training gang (nodes).")
    processes_per_worker: int = Field(
        2, ge=1, le=64, description="torchrun processes per pod (one per GPU on GPU nodes)."
    )
    gpus_per_worker: int = Field(0, ge=0, le=16, description="GPUs requested per training pod; 0 trains on CPU with gloo.")
    cpu_per_worker: float = Field(
        2.0, gt=0, le=512, multiple_of=0.001,
        description="CPU cores per training pod, requested and limited alike: with memory-gib-per-worker the gang's "
        "pods are Guaranteed QoS, the last the kubelet evicts under node pressure.",
    )
    memory_gib_per_worker: int = Field(
        8, ge=1, le=4096, description="Memory per training pod in GiB, requested and limited alike (Guaranteed QoS)."
    )
    lane: Lane = Field(Lane.standard, description="Priority lane: urgent, standard or batch.")


_GANG = GangShape.model_fields


class TrainingParameters(CanonicalModel):
    """Parameters of the ``training`` pipeline; each becomes a WorkflowTemplate argument.

    Field names are snake_case here and kebab-case in Argo (``image_size`` -> ``image-size``).
    """

    dataset_uri: str = Field(
        "example:digits",
        description="Dataset to train on: s3://bucket/prefix in ImageFolder layout (<label>/<image>.jpg); "
        "a .csv or .parquet manifest on s3:// with the columns uri (s3:// or relative to the manifest) and label; "
        "or example:digits for the bundled scikit-learn digits. pipectl run also takes a local folder or manifest; "
        "for a cluster, pipectl data push copies one to the store and prints its URI.",
    )
    image_size: int = Field(32, ge=8, le=512, description="Square side in pixels images are resized to.")
    epochs: int = Field(15, ge=1, le=1000, description="Passes over the training split.")
    batch_size: int = Field(32, ge=1, le=65536, description="Samples per optimiser step, per process.")
    learning_rate: float = Field(0.002, gt=0, le=10, description="Peak Adam learning rate (cosine decay to zero over the run).")
    architecture: Architecture = Field(
        Architecture.small_cnn,
        description="Model pipectl's training builds: small-cnn (small images, CPU friendly), resnet18 or resnet50 "
        "(torchvision, random initialisation). Registered as ONNX, so evaluate compares any two.",
    )
    workers: int = _GANG["workers"]
    processes_per_worker: int = _GANG["processes_per_worker"]
    gpus_per_worker: int = _GANG["gpus_per_worker"]
    cpu_per_worker: float = _GANG["cpu_per_worker"]
    memory_gib_per_worker: int = _GANG["memory_gib_per_worker"]
    lane: Lane = _GANG["lane"]
    model_name: str = Field("digits-cnn", description="Registered model name in the MLflow Model Registry.")
    promotion_metric: PromotionMetric = Field(
        PromotionMetric.accuracy, description="Held-out metric compared with the champion."
    )
    promotion_threshold: float = Field(
        0.95, ge=0, le=1, description="Minimum promotion-metric value a candidate needs to become champion."
    )
    validation_fraction: float = Field(0.2, gt=0, lt=1, description="Share of images held out for evaluation.")
    checkpoint_every_steps: int = Field(20, ge=1, le=1_000_000, description="Optimiser steps between checkpoints.")
    max_corrupt_fraction: float = Field(
        0.01, ge=0, le=1, description="Preprocess fails if more than this share of images is corrupt."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Random seed for initialisation and sampling.")
    shard_mib: int = Field(
        DEFAULT_SHARD_MIB, ge=1, le=SINGLE_PUT_MAX_MIB,
        description="Most MiB of images in one shard file preprocess writes (uint8 pixels): a training process holds "
        "about four shards at a time (1 MiB holds one image of the largest image-size, 512). At most 5120, the store's limit for one PUT.",
    )
    gang_preflight: bool = Field(
        True,
        description="Before training, time every link of the gang's ring (3 processes or more) and fail the "
        "attempt as the infrastructure's when one is several times slower than the others, naming its nodes.",
    )
    warm_cache: bool = Field(
        False,
        description="Warm the Alluxio cache over the staged dataset before preprocessing (step warm; "
        "needs PIPECTL_ALLUXIO_JOB_MASTER_URL in the store settings; preprocess/train then read "
        "through Alluxio's S3 proxy when PIPECTL_ALLUXIO_PROXY_URL is set).",
    )

    @model_validator(mode="after")
    def _one_process_per_gpu(self) -> "TrainingParameters":
        # C04: every pod runs processes-per-worker processes; on GPUs each needs its own device.
        if self.gpus_per_worker and self.processes_per_worker != self.gpus_per_worker:
            raise ValueError(
                f"processes-per-worker ({self.processes_per_worker}) must equal gpus-per-worker "
                f"({self.gpus_per_worker}) on GPU pods: one torchrun process per GPU"
            )
        return self

    @classmethod
    def from_overrides(cls, overrides: dict[str, str]) -> "TrainingParameters":
        """Build from ``key=value`` strings (CLI ``-p``); keys may be kebab- or snake-case.

        Raises ``ValueError`` naming an unknown key and the known ones; pydantic
        ``ValidationError`` for a bad value.
        """
        known = set(cls.model_fields)
        data: dict[str, Any] = {}
        for key, value in overrides.items():
            name = snake(key)
            if name not in known:
                raise ValueError(
                    f"unknown parameter {key!r}; known: {', '.join(sorted(kebab(k) for k in known))}"
                )
            data[name] = value
        return cls.model_validate(data)

    def as_arguments(self) -> dict[str, str]:
        """Argo argument values: ``{"image-size": "32", ...}`` (every value a string)."""
        out: dict[str, str] = {}
        for name in type(self).model_fields:
            v = getattr(self, name)
            if isinstance(v, bool):  # Argo `when` compares strings: true/false, as in YAML
                out[kebab(name)] = "true" if v else "false"
            elif isinstance(v, float):  # never an exponent: 1e-05 is not a plain decimal (C22)
                out[kebab(name)] = format(decimal.Decimal(repr(v)), "f")
            else:
                out[kebab(name)] = v.value if isinstance(v, enum.Enum) else str(v)
        return out



class ValidateOutput(StrictModel):
    """Output of the ``validate`` step: nothing but its exit code (0: every parameter is valid)."""

class StoreSettings(BaseSettings):
    """Where steps find the object store and tracking server; read from ``PIPECTL_*`` env vars.

    Read once at an edge (the CLI callback, a step's ``__main__``) and passed down.
    """

    model_config = SettingsConfigDict(env_prefix="PIPECTL_", extra="ignore")

    s3_endpoint: str | None = Field(None, description="S3 endpoint URL (Ceph RGW, MinIO, moto); None = AWS.")
    s3_access_key: str | None = None
    s3_secret_key: str | None = None
    s3_region: str = "us-east-1"
    bucket: str = Field("pipectl", description="Bucket for staged datasets, shards, checkpoints.")
    mlflow_uri: str | None = Field(None, description="MLflow tracking URI (http://host:port).")
    alluxio_proxy_url: str | None = Field(
        None, description="Alluxio proxy (http://host:39999): preprocess and train read staged data and shards through its S3 API."
    )
    alluxio_job_master_url: str | None = Field(
        None, description="Alluxio job master REST (http://host:20002): where warm submits its load jobs."
    )
    cephfs_mount: str | None = Field(
        None, description="Where the CephFS is mounted (ceph-fuse, kernel client or a ceph-csi volume): resolves cephfs:/// targets."
    )

    @field_validator("bucket")
    @classmethod
    def _bucket(cls, v: str) -> str:
        # S3 bucket naming rules (AWS S3 docs, "Bucket naming rules"; Ceph RGW enforces the same)
        if not _BUCKET.match(v) or ".." in v:
            raise ValueError("bucket names are 3-63 lowercase letters, digits, '.' or '-', starting and ending alphanumeric")
        return v

    def step_env(self) -> dict[str, str]:
        """The settings as ``PIPECTL_*`` env vars for a step process/pod."""
        env = {
            "PIPECTL_S3_REGION": self.s3_region,
            "PIPECTL_BUCKET": self.bucket,
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
        for key in ("s3_endpoint", "s3_access_key", "s3_secret_key", "mlflow_uri", "cephfs_mount",
                    "alluxio_proxy_url", "alluxio_job_master_url"):
            value = getattr(self, key)
            if value:
                env[f"PIPECTL_{key.upper()}"] = value
        return env


class RunSettings(StoreSettings):
    """Settings of ``pipectl run``: the store settings plus the local state folder."""

    state_dir: Path = Field(Path(".pipectl"), description="Folder for embedded services' state and step work dirs.")


# ---------------------------------------------------------------- store layout


def _join(base: str, *parts: str) -> str:
    out = base.rstrip("/")
    for part in parts:
        out += "/" + part.strip("/")
    return out


class DatasetLayout(StrictModel):
    """A staged dataset in the store (written by stage, read by warm and preprocess)::

        <root>/datasets/<digest[:20]>/data/<label>/<file>   one object per image
        <root>/datasets/<digest[:20]>/manifest.json         written last: marks completion

    ``dataset_uri`` is ``<root>/datasets/<digest[:20]>/`` (``s3://bucket/...``, ``cephfs:///...`` or a path).
    """

    dataset_uri: str

    DATASETS: ClassVar[str] = "datasets"
    DATA: ClassVar[str] = "data"
    MANIFEST: ClassVar[str] = "manifest.json"

    @classmethod
    def prefix_for(cls, digest: str) -> str:
        """Key prefix of the dataset with content digest ``digest`` under the store root: ``datasets/<digest[:20]>``."""
        return f"{cls.DATASETS}/{digest[:20]}"

    @classmethod
    def of_manifest(cls, manifest_uri: str) -> "DatasetLayout":
        """The layout of the dataset whose ``manifest.json`` is at ``manifest_uri``; ValueError otherwise."""
        base, _, name = manifest_uri.rstrip("/").rpartition("/")
        if name != cls.MANIFEST or not base:
            raise ValueError(f"{manifest_uri!r} is not a dataset's {cls.MANIFEST}")
        return cls(dataset_uri=base + "/")

    @classmethod
    def of_uri(cls, uri: str) -> "DatasetLayout | None":
        """The layout of the staged dataset ``uri`` names (its folder ``…/datasets/<digest[:20]>/``
        or its :attr:`data_uri`, what ``pipectl data push`` prints); None for any other URI."""
        m = re.fullmatch(rf"(.+/{cls.DATASETS}/[0-9a-f]{{20}})/({cls.DATA}/?)?", uri)
        return cls(dataset_uri=m[1] + "/") if m else None

    @property
    def data_uri(self) -> str:
        """``<dataset>/data/``: the images, one key per ``<label>/<file>``."""
        return _join(self.dataset_uri, self.DATA) + "/"

    @property
    def manifest_uri(self) -> str:
        return _join(self.dataset_uri, self.MANIFEST)


class RunLayout(StrictModel):
    """Where one pipeline run keeps its objects (train, evaluate and register receive ``run_uri``)::

        <run_uri>/shards/                   preprocess output (ShardIndex at shards/index.json)
        <run_uri>/checkpoints/step-<n>.pt   train checkpoints; checkpoints/latest.json points at the newest
        <run_uri>/train-output.json         TrainOutput (rank 0)
        <run_uri>/evaluate-output.json      EvaluateOutput

    ``run_uri`` is ``<store root>/runs/<workflow name>``: ``s3://<bucket>/runs/<workflow name>``,
    or under a team's prefix in a team's namespace (``s3://<bucket>/teams/<team>/runs/...``).
    """

    run_uri: str

    RUNS: ClassVar[str] = "runs"

    @classmethod
    def for_workflow(cls, bucket: str, workflow_name: str) -> "RunLayout":
        """The run of workflow ``workflow_name`` (an Argo tag such as ``{{workflow.name}}`` in templates)."""
        return cls.under(f"s3://{bucket}/", workflow_name)

    @classmethod
    def under(cls, root_uri: str, workflow_name: str) -> "RunLayout":
        """The run of workflow ``workflow_name`` under the store root ``root_uri`` (``s3://bucket/``
        or a prefix in it, ``s3://bucket/teams/vision/``)."""
        return cls(run_uri=_join(root_uri, cls.RUNS, workflow_name))

    @property
    def shards_uri(self) -> str:
        return _join(self.run_uri, "shards") + "/"

    @property
    def checkpoints_uri(self) -> str:
        """``<run_uri>/checkpoints/``: the run's checkpoints, the same folder for every attempt of
        the run (a restarted gang, a retried step)."""
        return _join(self.run_uri, "checkpoints") + "/"

    @property
    def latest_checkpoint_uri(self) -> str:
        return _join(self.checkpoints_uri, "latest.json")

    def checkpoint_uri(self, step: int) -> str:
        """The checkpoint after optimiser step ``step`` (zero-padded to 8 digits: keys sort by step)."""
        return _join(self.checkpoints_uri, f"step-{step:08d}.pt")

    @property
    def train_output_uri(self) -> str:
        return _join(self.run_uri, "train-output.json")

    @property
    def evaluate_output_uri(self) -> str:
        return _join(self.run_uri, "evaluate-output.json")


# ---------------------------------------------------------------- step contracts


class ManifestEntry(StrictModel):
    """One staged object: ``key`` relative to the dataset's data prefix, e.g. ``3/img_0012.jpg``."""

    key: str
    size: int = Field(ge=0, description="bytes")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    label: str


class DatasetManifest(StrictModel):
    """Written last at ``<prefix>/manifest.json``: its presence marks a complete staging."""

    digest: str = Field(description="sha256 over sorted (key, sha256) pairs: the content address.")
    source_uri: str
    labels: list[str]
    entries: list[ManifestEntry]

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)


class DatasetMax(StrictModel):
    """The largest dataset a lane takes (``None``: no bound of that kind).

    ``max_gib``: bytes of the dataset as submitted, in GiB (2**30 bytes): the staged images, or
    the shard files of shards a team already has. ``max_samples``: images (a pre-built dataset's
    samples, both splits)."""

    max_gib: float | None = Field(None, gt=0, allow_inf_nan=False,  # no infinity: null is no bound
                                  description="Most GiB of images (staged files, or shard files).")
    max_samples: int | None = Field(None, ge=1, description="Most images (samples, every split).")

    @field_validator("max_gib", "max_samples", mode="before")
    @classmethod
    def _not_a_boolean(cls, v: Any) -> Any:
        if isinstance(v, bool):  # a site file's `max_samples: true` is no maximum of 1 image
            raise ValueError("a number, not true or false (null: no bound)")
        return v


def _lane_rows(value: Any) -> Any:
    """Each lane's maximum given as JSON text of rows (a step's argument: ``[{"lane": "urgent",
    "max_gib": 20, ...}, ...]``, never ``}}``, which Argo would read as the end of a tag) as a mapping."""
    rows = json.loads(value) if isinstance(value, str) else value
    if isinstance(rows, list) and all(isinstance(r, dict) and "lane" in r for r in rows):
        return {r["lane"]: {k: v for k, v in r.items() if k != "lane"} for r in rows}
    return rows


LaneDatasetMax = Annotated[dict[Lane, DatasetMax], BeforeValidator(_lane_rows)]
"""The largest dataset of each lane: what stage and the ``shards`` step refuse."""


class StageInput(StrictModel):
    source_uri: str = Field(description="Local folder or s3://bucket/prefix in ImageFolder layout.")
    bucket: str
    max_concurrency: int = Field(
        64, ge=1, le=256,
        description="Writes in flight at once (a store such as Ceph RGW spends less CPU a small object "
        "with more of them in flight).",
    )
    target_uri: str | None = Field(
        None,
        description="Where to stage: s3://<bucket> (default: s3://<bucket>) or a prefix in it (s3://<bucket>/<path>/: "
        "a team's), cephfs:///<path> (inside the CephFS mounted at PIPECTL_CEPHFS_MOUNT) or an absolute path on a "
        "mounted file system.",
    )
    lane: Lane | None = Field(None, description="The run's lane: whose dataset maximum applies.")
    dataset_max: LaneDatasetMax | None = Field(None, description="The largest dataset of each lane (JSON); none: no bound.")


class StageOutput(StrictModel):
    dataset_uri: str = Field(description="<target>/datasets/<digest>/ (the content-addressed prefix), e.g. s3://bucket/datasets/<digest>/.")
    manifest_uri: str
    objects: int
    bytes: int
    copied: int = Field(description="Objects written by this run (0 when already staged).")
    skipped: int = Field(description="Objects already present and verified.")
    retries: int = Field(0, description="Requests retried (throttling, 5xx, resets) for the writes.")


class WarmInput(StrictModel):
    manifest_uri: str = Field(description="s3://bucket/datasets/<digest>/manifest.json (a stage output).")
    batch_size: int = Field(256, ge=1, le=10000, description="Files per Alluxio load job.")
    timeout_s: float = Field(1800, gt=0, description="seconds to wait for the load jobs")


class WarmOutput(StrictModel):
    files: int
    bytes: int = Field(description="Bytes of the dataset (manifest).")
    cached_bytes: int = Field(description="Bytes Alluxio workers hold after the load (inAlluxioPercentage x length).")
    jobs: int = Field(description="Load jobs submitted.")
    seconds: float = Field(description="Wall time of submit + wait + status, seconds.")


class PreprocessInput(StrictModel):
    manifest_uri: str
    output_uri: str = Field(description="s3://bucket/runs/<workflow>/shards/ (RunLayout.shards_uri)")
    image_size: int = Field(ge=8, le=512)
    validation_fraction: float = Field(gt=0, lt=1)
    max_corrupt_fraction: float = Field(ge=0, le=1)
    batch_size: int = Field(256, ge=1)
    shard_size: int = Field(2048, ge=1, description="Images per shard file (fewer where shard-mib is reached first).")
    shard_mib: int = Field(DEFAULT_SHARD_MIB, ge=1, le=SINGLE_PUT_MAX_MIB, description="Most MiB of images per shard file.")
    device: Literal["auto", "cpu", "gpu"] = "auto"


class ShardIndex(StrictModel):
    """``<output_uri>/index.json``: the shards of each split and the class names."""

    labels: list[str]
    image_size: int
    channels: int
    mean: list[float]
    std: list[float]
    train: list[str]
    validation: list[str]
    train_count: int = Field(ge=0)  # a negative count would pass a lane's max_samples
    validation_count: int = Field(ge=0)
    train_sizes: list[int] = Field(default_factory=list, description="Samples in each train shard (same order as train).")
    validation_sizes: list[int] = Field(default_factory=list, description="Samples in each validation shard.")


class PreprocessOutput(StrictModel):
    shards_uri: str
    train_count: int
    validation_count: int
    corrupt: int
    images_per_s: float
    device: str


class PrebuiltInput(StrictModel):
    shards_uri: str = Field(description="s3://bucket/prefix/ holding index.json and the .npz shards it lists.")
    lane: Lane | None = Field(None, description="The run's lane: whose dataset maximum applies.")
    dataset_max: LaneDatasetMax | None = Field(None, description="The largest dataset of each lane (JSON); none: no bound.")


class PrebuiltOutput(StrictModel):
    shards_uri: str
    train_count: int
    validation_count: int


def _required(name: str) -> Any:
    """:class:`TrainingParameters`' field ``name`` (its bounds, its description) without a default."""
    import copy

    from pydantic_core import PydanticUndefined

    field = copy.copy(TrainingParameters.model_fields[name])
    field.default = PydanticUndefined
    return field


class TrainInput(CanonicalModel):
    """The train step's arguments: read by every process of the gang, with the same spelling rules
    and bounds as ``validate`` (a run's parameters reach them as text)."""

    shards_uri: str
    run_uri: str = Field(description="s3://bucket/runs/<workflow>: checkpoints and train output live here (RunLayout).")
    workflow_name: str
    model_name: str = _required("model_name")
    epochs: int = _required("epochs")
    batch_size: int = _required("batch_size")
    learning_rate: float = _required("learning_rate")
    checkpoint_every_steps: int = _required("checkpoint_every_steps")
    seed: int = _required("seed")
    architecture: Architecture = TrainingParameters.model_fields["architecture"]
    gang_preflight: bool = TrainingParameters.model_fields["gang_preflight"]
    function: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)?$",
                          description="The user's train function as module.path:name; empty: pipectl's own.")


class TrainOutput(StrictModel):
    """Written by rank 0 to ``RunLayout.train_output_uri``."""

    mlflow_run_id: str
    model_uri: str = Field(description="runs:/<run id>/model")
    steps: int
    steps_this_attempt: int
    resumed_from_step: int
    world_size: int
    train_accuracy: float | None = None
    """None when the user's own torchrun code trained (it reports its metrics itself)."""
    verdicts: list[str] = Field(default_factory=list, description="What the step anatomy said (starved, fabric-bound, straggler...), each with its rule.")
    step_time: str = Field("", description="The last epoch's step anatomy: shares of data, compute, sync, optimizer, checkpoint; "
                           "images/s of the gang and of each rank; the largest memory now and at its peak.")
    anatomy: dict[str, float] = Field(default_factory=dict, description="The same as numbers: share_<part>, images_per_s, "
                                      "slowest_rank_ratio, memory_mib_max, memory_peak_mib_max, and rank<R>/images_per_s, "
                                      "rank<R>/step_ms, rank<R>/memory_mib, rank<R>/memory_peak_mib of each rank "
                                      "(empty when the user's own torchrun code trained).")


class EvaluateInput(StrictModel):
    shards_uri: str
    run_uri: str = Field(description="s3://bucket/runs/<workflow>: reads the train output, writes the evaluate output (RunLayout).")
    model_name: str
    promotion_metric: PromotionMetric
    promotion_threshold: float = Field(ge=0, le=1)
    metric_function: str = Field("", pattern=r"^([A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*)?$",
                                 description="The user's metric as module.path:name; it decides instead of promotion_metric.")


class EvaluateOutput(StrictModel):
    """The evaluate step's outputs (Argo output parameters, which register takes as its inputs), also
    written to ``RunLayout.evaluate_output_uri`` for people and ``pipectl status``."""

    mlflow_run_id: str
    model_uri: str
    metrics: dict[str, float]
    metric: float
    champion_version: str | None
    champion_metric: float | None
    decision: Decision
    metric_name: str = ""
    """The metric that decided: ``promotion_metric``'s value, or the user's metric's name."""
    training_step_time: str = ""
    """The train step's last epoch's step anatomy (its output, shown here for the Argo UI and ``pipectl status``)."""
    training_verdicts: list[str] = Field(default_factory=list)
    """The train step's verdicts (starved, fabric-bound, straggler), each with its rule."""
    training_images_per_s: float = 0.0
    """The gang's images per second over the last epoch (0: not measured, the user's own torchrun code trained)."""
    training_data_share: float = 0.0
    """Share of the last epoch's step time spent waiting for data (the starved verdict's measure)."""
    training_sync_share: float = 0.0
    """Share spent in gradient sync not hidden behind compute (the fabric-bound verdict's measure)."""
    training_slowest_rank_ratio: float = 0.0
    """The slowest rank's own step time over the gang's median (the straggler verdict's measure)."""
    model_sha256: str = ""
    """Digest of the logged model evaluate scored (:func:`~pipectl.components.models.model_sha256`):
    register registers that model and no other."""
    pictures: list[str] = Field(default_factory=list, description="Artifacts of the MLflow run with the confusion matrix "
                                "and the learning curve (evaluation/...png).")
    challenger_metric: float | None = None
    """The candidate's deciding metric on the split the champion was scored on (``compared_on``),
    when that is not the candidate's own: what ``champion_metric`` is compared with."""
    evaluation_set: str = ""
    """The candidate's held-out split (its shards' ``index.json`` folder): registered with the version
    (:data:`EVALUATION_SET_TAG`), so a later candidate is compared with it on these images."""
    evaluation_set_sha256: str = ""
    """Digest of that split's content as evaluate read it (:data:`EVALUATION_SET_DIGEST_TAG`)."""
    compared_on: str = ""
    """The split candidate and champion were both scored on: the champion's registered evaluation
    set, or (a champion registered without one) the candidate's own; empty: no champion scored."""
    decision_reason: str = ""
    """Why the candidate was promoted or kept, in one line: its metric against the threshold and the
    champion's, or why the two could not be compared (e.g. the champion's evaluation set has other
    labels, or changed since it was registered)."""


EVALUATION_SET_TAG = "pipectl.evaluation_set"
"""Model version tag: the held-out split the version was evaluated on (``s3://…/shards/``)."""
EVALUATION_SET_DIGEST_TAG = "pipectl.evaluation_set_sha256"
"""Model version tag: the digest of that split's content (labels, image shape, every image and label)."""
_SHA256 = r"^[0-9a-f]{64}$"


class RegisterInput(StrictModel):
    """What register acts on: evaluate's decision, handed over as the evaluate step's output
    parameters (in the workflow's status, not in the store, where any holder of the store's keys
    could rewrite it), and the digest of the model it scored."""

    model_name: str
    run_key: str = Field(description="Identity of the pipeline run (the workflow uid): one version per key.")
    promotion_metric: PromotionMetric
    mlflow_run_id: str = Field(min_length=1, description="The candidate's MLflow run (evaluate's output).")
    model_uri: str = Field(min_length=1, description="The candidate's logged model (evaluate's output).")
    model_sha256: str = Field(pattern=_SHA256, description="Digest of the model evaluate scored: register refuses any other.")
    decision: Decision = Field(description="promote or keep (evaluate's output).")
    metric: float = Field(description="The deciding metric's value (evaluate's output).")
    metric_name: str = Field("", description="The deciding metric's name (evaluate's output).")
    champion_version: str = Field("", description="The champion evaluate compared against; empty: none.")
    evaluation_set: str = Field("", description="The candidate's held-out split (evaluate's output): tagged on the version.")
    evaluation_set_sha256: str = Field("", pattern=r"^([0-9a-f]{64})?$",
                                       description="Digest of that split's content (evaluate's output): tagged on the version.")

    def evaluation(self) -> "EvaluateOutput":
        """Evaluate's outputs as :class:`EvaluateOutput` (what register decides from)."""
        return EvaluateOutput(mlflow_run_id=self.mlflow_run_id, model_uri=self.model_uri, metrics={self.metric_name or
                              self.promotion_metric.value: self.metric}, metric=self.metric,
                              champion_version=self.champion_version or None, champion_metric=None,
                              decision=self.decision, metric_name=self.metric_name, model_sha256=self.model_sha256,
                              evaluation_set=self.evaluation_set, evaluation_set_sha256=self.evaluation_set_sha256)


class RegisterOutput(StrictModel):
    model_name: str
    version: str
    alias: str | None
    created: bool = Field(description="False when a retried step found its own earlier version.")
    champion_version: str | None


class ReleaseInput(StrictModel):
    """Input of the ``gang-release`` exit handler: end every gang job of a run that did not succeed."""

    workflow_name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253,
                               description="The run (Workflow) whose gang jobs are deleted.")
    workflow_status: str = Field(description="The run's phase as Argo ends it: Succeeded (nothing to do), Failed or Error.")
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    job_kind: str = Field(pattern=r"^[a-z0-9.-]+/v[a-z0-9]+/[a-z]+$",
                          description="group/version/plural of the gang job kind (the launcher's).")
    timeout_s: float = Field(120, gt=0, le=3600, description="Seconds to wait for the gang's pods to be gone.")


class AvoidInput(StrictModel):
    """Input of the ``gang-avoid`` step, which runs after a train attempt Failed: was it the gang
    preflight's slow link (a gang pod exited :attr:`ExitCode.AVOID_NODES` naming nodes)? Then the
    failed job is deleted and the next attempt's node affinity written; otherwise the step fails."""

    workflow_name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=253,
                               description="The run (Workflow) whose train attempt failed.")
    namespace: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
    job_kind: str = Field(pattern=r"^[a-z0-9.-]+/v[a-z0-9]+/[a-z]+$",
                          description="group/version/plural of the gang job kind (the launcher's).")
    retries: int = Field(ge=0, description="Retries of the train step so far (after a backoff or to avoid nodes).")
    retry_limit: int = Field(ge=0, le=50, description="Retries the policy allows (infra_limit).")
    avoid_limit: int = Field(ge=0, le=64, description="Most nodes the gang avoids; nodes named after that are not added.")
    gang_affinity: str = Field(max_length=16384, description="The failed attempt's gang affinity (JSON; {} for none).")
    timeout_s: float = Field(120, gt=0, le=3600, description="Seconds to wait for the failed gang's pods to be gone.")


class AvoidOutput(StrictModel):
    gang_affinity: str = Field(description="The next attempt's gang affinity (JSON): a preferred node "
                                           "anti-affinity against every node avoided so far, and the site's "
                                           "placement of the gang (its pod affinity), kept.")


class ReleaseOutput(StrictModel):
    """The ``gang-release`` step reports in its log only (no output parameters)."""
