"""What every command shares: the error boundary, the console, shared options, parameter parsing.

Data on stdout, people on stderr; exit codes per DESIGN.md (0 ok, 1 failed, 2 usage/validation,
3 unreachable/unauthorised). Heavy imports (hera, torch, mlflow, boto3, pydantic) stay inside
functions so ``pipectl --help`` is fast; choices come from the one place that defines them
(lanes from :mod:`pipectl.components.names`, launchers from their registry, read lazily).
"""

from __future__ import annotations

from typing import Any, Callable, NoReturn, Sequence

import click

from pipectl.components.errors import PipectlError
from pipectl.components.names import LANE_NAMES

OUTPUT_FORMATS = ("text", "json")


def fail(headline: str, hint: str = "", *, code: int = 1) -> NoReturn:
    """Raise a :class:`PipectlError` that exits with ``code``."""
    raise PipectlError(headline, hint, cli_exit=code)


def console() -> Any:
    """A rich console on stderr (people's output)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class Group(click.Group):
    """Catches :class:`PipectlError` at one boundary: headline + hint on stderr, its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.exceptions.Abort):
            console().print("[yellow]interrupted[/]: everything this run started has been stopped")
            ctx.exit(130)
        except PipectlError as e:
            out = console()
            out.print(f"[bold red]error:[/] {e.headline}", soft_wrap=True)
            if e.hint:
                out.print(f"[dim]hint:[/] {e.hint}", soft_wrap=True)
            ctx.exit(e.exit_code)


class LazyChoice(click.Choice):
    """A :class:`click.Choice` whose values are read from their source when first needed."""

    def __init__(self, source: Callable[[], Sequence[str]]) -> None:
        self._source = source
        self._choices: Sequence[str] | None = None
        self.case_sensitive = True

    @property
    def choices(self) -> Sequence[str]:  # type: ignore[override]
        if self._choices is None:
            self._choices = tuple(self._source())
        return self._choices

    @choices.setter
    def choices(self, value: Sequence[str]) -> None:
        self._choices = tuple(value)


def _launcher_names() -> list[str]:
    from pipectl.pipelines.launchers import LAUNCHERS

    return list(LAUNCHERS)


def launcher_option(fn: Callable) -> Callable:
    return click.option("--launcher", type=LazyChoice(_launcher_names), default=None,
                        help="Gang job kind the train step creates (the launcher registry; default: the first listed).")(fn)


def lane_option(fn: Callable) -> Callable:
    return click.option("--lane", type=click.Choice(LANE_NAMES), default=None, help="Priority lane (same as -p lane=...).")(fn)


def output_option(fn: Callable) -> Callable:
    return click.option("--output", "output_format", type=click.Choice(OUTPUT_FORMATS), default="text", show_default=True)(fn)


def parameter_option(fn: Callable) -> Callable:
    return click.option("-p", "--parameter", "params", multiple=True, metavar="KEY=VALUE", help="Workflow parameter (repeatable).")(fn)


def image_options(fn: Callable) -> Callable:
    """``--registry`` and ``--image NAME=REF`` (repeatable): where the step images come from and,
    per image, an immutable reference (digest or content tag) instead of the release tag."""
    fn = click.option("--image", "images", multiple=True, metavar="NAME=REF",
                      help="Step image reference: step-light=sha256:<digest> or step-train=c-<content hash> (repeatable).")(fn)
    return click.option("--registry", default=None, help="Registry/path of the step images [default: pipectl].")(fn)


def image_config(registry: str | None, images: Sequence[str]) -> dict[str, Any]:
    """CompileConfig fields of :func:`image_options` (exit 2 for a pair without ``=``)."""
    fields: dict[str, Any] = {"images": parse_overrides(images)} if images else {}
    if registry:
        fields["registry"] = registry
    return fields


def cluster_options(fn: Callable) -> Callable:
    """``--namespace/-n`` and ``--context`` of commands that talk to the cluster."""
    fn = click.option("--namespace", "-n", default="pipectl", show_default=True, envvar="PIPECTL_NAMESPACE")(fn)
    return click.option("--context", default=None, help="kubeconfig context (default: current).")(fn)


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``("epochs=5", ...)`` -> ``{"epochs": "5"}``; exit 2 naming a pair without ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"parameter {pair!r} is not key=value", "write -p epochs=5", code=2)
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def training_parameters(pairs: Sequence[str]) -> Any:
    """Validate ``-p`` overrides against :class:`TrainingParameters`; exit 2 with every problem named."""
    from pydantic import ValidationError

    from pipectl.components.contracts import TrainingParameters

    try:
        return TrainingParameters.from_overrides(parse_overrides(pairs))
    except ValueError as e:
        if isinstance(e, ValidationError):
            problems = "; ".join(
                f"{'.'.join(str(x).replace('_', '-') for x in err['loc'])}: {err['msg']}"
                + (f" (got {err['input']!r})" if "input" in err else "")
                for err in e.errors()
            )
            fail(f"invalid parameter: {problems}", "see `pipectl render training` for each parameter's type and values", code=2)
        fail(str(e), "parameters are the WorkflowTemplate arguments, e.g. -p epochs=5 -p lane=urgent", code=2)


def compile_config(bucket: str | None = None, launcher: str | None = None, **fields: Any) -> Any:
    """The :class:`CompileConfig` of a command's options (None: the default); exit 2 naming a bad value."""
    from pydantic import ValidationError

    from pipectl.pipelines.training import CompileConfig

    given = {"bucket": bucket, "launcher": launcher, **fields}
    try:
        return CompileConfig(**{k: v for k, v in given.items() if v is not None})
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        fail(f"invalid option: {problems}", "see the command's --help", code=2)
