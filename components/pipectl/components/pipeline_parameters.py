"""A pipeline's own parameters: what a team's pipeline declares besides pipectl's
(:class:`~pipectl.components.contracts.TrainingParameters`), e.g. ``weight-decay`` for its train
function or ``notify-channel`` for its own step.

One representation, :class:`ParameterSpec` (plain data, JSON), is made from the user's
:class:`Parameters` class when the pipeline is compiled and read by everything after: the
WorkflowTemplate's arguments (typed, described, a drop-down for choices), the CLI's ``-p`` and
``--help``, the ``validate`` step inside the cluster (it gets the specs as a constant of the
template, not the user's code), the admission policy's rules, and the training code
(:meth:`Parameters.from_env`). :func:`parameter_model` turns specs back into one pydantic model:
``TrainingParameters`` and the pipeline's fields, held to the same rules (one spelling per value,
plain text: field cases C15 and C22).

Values reach a gang's pods as environment variables ``PIPECTL_PARAM_<NAME>`` (``weight-decay`` ->
``PIPECTL_PARAM_WEIGHT_DECAY``), written into the job's manifest by Argo's substitution; so text
values may not hold quotes or backslashes (they could end a YAML string there).
"""

from __future__ import annotations

import enum
import functools
import json
import os
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator
from pydantic.fields import FieldInfo

from pipectl.components.contracts import TrainingParameters, kebab, snake

ENV_PREFIX = "PIPECTL_PARAM_"
"""Environment variable of a pipeline parameter in a gang pod: ``PIPECTL_PARAM_WEIGHT_DECAY``."""
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_UNSAFE_TEXT = set("'\"\\")
SPECS_INPUT = "pipeline_parameters"
"""The ``validate`` step's option (``--pipeline-parameters``) carrying the specs (:func:`specs_json`):
a constant of the compiled template, so validate checks a pipeline's parameters without its code."""
MAX_TEXT = 256
MAX_PARAMETERS = 64


def env_name(name: str) -> str:
    """``weight-decay`` -> ``PIPECTL_PARAM_WEIGHT_DECAY``."""
    return ENV_PREFIX + snake(name).upper()


class ParameterSpec(BaseModel):
    """One parameter a pipeline declares, as data: its kebab-case name, kind, default (as the
    text an argument carries), description and bounds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=63, description="kebab-case, as in the Argo UI and -p NAME=VALUE")
    kind: Literal["integer", "decimal", "boolean", "text", "choice"]
    default: str
    description: str = Field(min_length=1, max_length=1000)
    choices: tuple[str, ...] = ()
    ge: int | float | None = None
    gt: int | float | None = None
    le: int | float | None = None
    lt: int | float | None = None
    pattern: str | None = Field(None, description="text: a regular expression the whole value must match")
    max_length: int = Field(MAX_TEXT, ge=1, le=2048, description="text: at most this many characters")

    @field_validator("default", "description", "pattern", "choices")
    @classmethod
    def _no_argo_tags(cls, v: Any) -> Any:
        for text in (v if isinstance(v, tuple) else (v,)):
            if text is not None and ("{{" in text or "}}" in text):
                raise ValueError("may not contain '{{' or '}}': Argo would read an expression in it")
        return v

    @field_validator("name")
    @classmethod
    def _kebab(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"{v!r}: a kebab-case name (a-z, 0-9, '-')")
        return v

    def field(self) -> tuple[Any, FieldInfo]:
        """The pydantic annotation and field of this parameter."""
        bounds = {k: (int(v) if self.kind == "integer" else v) for k in ("ge", "gt", "le", "lt")
                  if (v := getattr(self, k)) is not None}
        if self.kind == "integer":
            return int, Field(int(self.default), description=self.description, **bounds)
        if self.kind == "decimal":
            return float, Field(float(self.default), description=self.description, **bounds)
        if self.kind == "boolean":
            return bool, Field(self.default == "true", description=self.description)
        if self.kind == "choice":
            kind = _choices_enum(self.name, self.choices)
            return kind, Field(kind(self.default), description=self.description)
        return (Annotated[str, AfterValidator(_safe_text)],
                Field(self.default, description=self.description, max_length=self.max_length,
                      pattern=None if self.pattern is None else f"^(?:{self.pattern})$"))


@functools.lru_cache(maxsize=256)
def _choices_enum(name: str, choices: tuple[str, ...]) -> type[enum.Enum]:
    return enum.Enum(snake(name).title().replace("_", ""), {c: c for c in choices}, type=str)  # type: ignore[return-value]


def _safe_text(v: str) -> str:
    if _UNSAFE_TEXT & set(v):
        raise ValueError("text parameters may not contain quotes or backslashes")
    return v


def specs_json(specs: tuple[ParameterSpec, ...]) -> str:
    """The specs as one line of JSON (what the ``validate`` step and the gang are given)."""
    return json.dumps([s.model_dump(exclude_defaults=True) for s in specs], separators=(",", ":"), sort_keys=True)


def specs_from_json(text: str) -> tuple[ParameterSpec, ...]:
    return tuple(ParameterSpec.model_validate(s) for s in json.loads(text or "[]"))


@functools.lru_cache(maxsize=64)
def _model(specs: str) -> type[TrainingParameters]:
    fields = {snake(s.name): s.field() for s in specs_from_json(specs)}
    return create_model("RunParameters", __base__=TrainingParameters, **fields)  # type: ignore[call-overload, no-any-return]


def parameter_model(specs: tuple[ParameterSpec, ...] = ()) -> type[TrainingParameters]:
    """pipectl's parameters and the pipeline's ``specs`` as one model (a subclass of
    ``TrainingParameters``, so everything that takes those takes it); ``TrainingParameters``
    itself when there are none."""
    return _model(specs_json(specs)) if specs else TrainingParameters


# -- the user's declaration ------------------------------------------------------------------------

class Parameters(BaseModel):
    """Base class of a pipeline's own parameters. Each field needs a type (``int``, ``float``,
    ``bool``, ``str``, a ``str`` Enum or ``Literal`` of strings), a default and a description;
    bounds with ``ge``/``gt``/``le``/``lt``, text with ``pattern``/``max_length``::

        class ShapesParameters(Parameters):
            weight_decay: float = Field(0.0001, ge=0, le=1, description="L2 penalty of the optimiser.")
            augment: bool = Field(True, description="Random flips and crops while training.")

        Pipeline("shapes", [...], parameters=ShapesParameters)

    In the gang's code (a train function or your own torchrun script), read them with
    ``ShapesParameters.from_env()``; a :class:`ContainerStep` takes ``parameter("weight-decay")``."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Parameters":
        """This run's values, from the gang pod's environment (``PIPECTL_PARAM_<NAME>``); a field
        not in it keeps its default. ValueError naming the bad value."""
        env = os.environ if environ is None else environ
        values = {n: env[env_name(kebab(n))] for n in cls.model_fields if env_name(kebab(n)) in env}
        try:
            return cls.model_validate(values)
        except ValidationError as e:
            raise ValueError(f"pipeline parameters from the environment: {e}") from e


def specs_from_class(cls: Any) -> tuple[ParameterSpec, ...]:
    """The specs of a :class:`Parameters` subclass. ValueError naming the field and the fix: an
    unsupported type, no default, no description, a name pipectl already has, a default its own
    bounds refuse."""
    where = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
        what = "a class, not a pydantic model" if isinstance(cls, type) else f"a {type(cls).__name__}, not a class"
        raise ValueError(f"parameters={where} is {what}; write class MyParameters(pipectl.sdk.Parameters) with typed fields")
    if len(cls.model_fields) > MAX_PARAMETERS:
        raise ValueError(f"{where}: {len(cls.model_fields)} fields; at most {MAX_PARAMETERS}")
    specs = tuple(_spec(where, n, f) for n, f in cls.model_fields.items())
    try:
        parameter_model(specs).model_validate({snake(s.name): s.default for s in specs})
    except ValidationError as e:
        raise ValueError(f"{where}: a default its own rules refuse: {e}") from e
    except Exception as e:  # pydantic's SchemaError: a pattern its regular expressions cannot compile
        raise ValueError(f"{where}: {e}") from e
    return specs


def _spec(where: str, name: str, f: FieldInfo) -> ParameterSpec:
    at = f"{where}.{name}"
    if name in TrainingParameters.model_fields or not _NAME.match(kebab(name)):
        raise ValueError(f"{at}: {'pipectl already has a parameter ' + kebab(name) if name in TrainingParameters.model_fields else 'not a lower_snake_case name'}; "
                         "rename the field")
    if f.is_required() or f.default_factory is not None:
        raise ValueError(f"{at}: give it a default, e.g. = Field(0.1, description=...): the Argo UI and cron runs start from it")
    if not f.description:
        raise ValueError(f"{at}: describe it: Field(..., description='what it does, its unit'); the Argo UI and --help show it")
    kind, choices, default = _kind(at, f.annotation, f.default)
    meta: dict[str, Any] = {}
    for m in f.metadata:
        for key in ("ge", "gt", "le", "lt", "pattern", "max_length"):
            if getattr(m, key, None) is not None:
                meta[key] = getattr(m, key)
    if kind not in ("integer", "decimal") and any(k in meta for k in ("ge", "gt", "le", "lt")):
        raise ValueError(f"{at}: bounds (ge, gt, le, lt) are for int and float fields")
    if kind != "text" and any(k in meta for k in ("pattern", "max_length")):
        raise ValueError(f"{at}: pattern and max_length are for str fields")
    return ParameterSpec(name=kebab(name), kind=kind, default=default, description=" ".join(f.description.split()),
                         choices=choices, **meta)


def _kind(at: str, annotation: Any, default: Any) -> tuple[str, tuple[str, ...], str]:
    """The spec kind, choices and default text of a field's type."""
    from typing import get_args, get_origin

    if annotation is bool:
        return "boolean", (), "true" if default else "false"
    if annotation is int:
        return "integer", (), str(default)
    if annotation is float:
        return "decimal", (), _decimal(default)
    if annotation is str:
        return "text", (), str(default)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum) and all(isinstance(m.value, str) for m in annotation):
        return "choice", tuple(m.value for m in annotation), default.value if isinstance(default, enum.Enum) else str(default)
    if get_origin(annotation) is Literal and all(isinstance(a, str) for a in get_args(annotation)):
        return "choice", tuple(get_args(annotation)), str(default)
    raise ValueError(f"{at}: type {annotation!r} is not a parameter type; use int, float, bool, str, "
                     "a str Enum or Literal['a', 'b']")


def _decimal(v: Any) -> str:
    import decimal

    return format(decimal.Decimal(repr(float(v))), "f")
