"""What every command shares: the error boundary, the console, shared options, parameter parsing.

Data on stdout, people on stderr; exit codes (0 ok, 1 failed, 2 usage/validation,
3 unreachable/unauthorised). Heavy imports (hera, torch, mlflow, boto3, pydantic) stay inside
functions so ``pipectl --help`` is fast; choices come from the one place that defines them
(lanes from :mod:`pipectl.components.names`, launchers from their registry, read lazily).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

import click

from pipectl.components.errors import PipectlError
from pipectl.components.names import LANE_NAMES

OUTPUT_FORMATS = ("text", "json")
LISTING_FORMATS = ("text", "wide", "json", "yaml", "name")
"""``-o`` of the commands that show cluster objects (list, status, submit, cron list), as ``kubectl``
and ``argo`` spell them: ``text`` a table, ``wide`` the table with more columns, ``json``/``yaml``
the rows for machines, ``name`` one name a line."""

STEPS_EXTRA = "pipectl-ml[steps]"
STEPS_MODULES = frozenset({"torch", "mlflow", "nvidia", "boto3", "botocore", "moto", "psutil", "numpy", "PIL", "sklearn"})
"""The ``steps`` extra (pyproject.toml) and the top-level modules it brings: what the light install lacks."""


def fail(headline: str, hint: str = "", *, code: int = 1) -> NoReturn:
    """Raise a :class:`PipectlError` that exits with ``code``."""
    raise PipectlError(headline, hint, cli_exit=code)


def console() -> Any:
    """A rich console on stderr (people's output)."""
    from rich.console import Console

    return Console(stderr=True, highlight=False)


class Group(click.Group):
    """Catches :class:`PipectlError` at one boundary: headline + hint on stderr, its exit code.
    ``ALIASES``: the names ``argo`` users type for a command (``pipectl get NAME`` is ``status``)."""

    ALIASES = {"get": "status", "watch": "wait"}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.ALIASES.get(cmd_name, cmd_name))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_commands(ctx, formatter)
        with formatter.section("Aliases"):
            formatter.write_dl([(alias, f"= {name}") for alias, name in self.ALIASES.items()])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (KeyboardInterrupt, click.exceptions.Abort):
            console().print("[yellow]interrupted[/]: everything this run started has been stopped")
            ctx.exit(130)
        except PipectlError as e:
            from rich.markup import escape

            out = console()  # the texts are plain (they may hold brackets: pipectl[steps], a YAML list)
            out.print(f"[bold red]error:[/] {escape(e.headline)}", soft_wrap=True)
            if e.hint:
                out.print(f"[dim]hint:[/] {escape(e.hint)}", soft_wrap=True)
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
    return click.option("--output", "-o", "output_format", type=click.Choice(OUTPUT_FORMATS), default="text", show_default=True)(fn)


def listing_output_option(fn: Callable) -> Callable:
    return click.option("--output", "-o", "output_format", type=click.Choice(LISTING_FORMATS), default="text", show_default=True,
                        help="text: a table; wide: more columns; json/yaml: the rows; name: one name a line.")(fn)


def needs_steps_extra(what: str) -> Callable[[Callable], Callable]:
    """Decorator of a command that runs the steps' code (``run``, ``data example``): without the
    ``steps`` extra (the light install) it exits 2 naming the extra, instead of an ImportError."""

    def wrap(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except ModuleNotFoundError as e:
                if (e.name or "").split(".")[0] not in STEPS_MODULES:
                    raise
                fail(f"{what} needs the steps' dependencies: {e.name} is not installed (this is the light install)",
                     f"install the steps extra from your pipectl checkout: pip install '<checkout>[steps]' "
                     f"(the distribution {STEPS_EXTRA}; the pipectl on PyPI is another project)", code=2)

        return checked

    return wrap


def parameter_option(fn: Callable) -> Callable:
    """``-p KEY=VALUE`` (repeatable) and ``--parameter-file FILE`` (YAML or JSON: a mapping of
    parameter names to values, as ``argo submit --parameter-file``); ``-p`` wins over the file."""
    fn = click.option("-p", "--parameter", "params", multiple=True, metavar="KEY=VALUE",
                      help="Workflow parameter (repeatable; overrides --parameter-file).")(fn)
    return click.option("--parameter-file", "-f", "parameter_file", default=None, metavar="FILE",
                        type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help="YAML or JSON file of parameters ({epochs: 5, lane: urgent}).")(fn)


def parameter_file_pairs(path: Path | None) -> tuple[str, ...]:
    """The ``KEY=VALUE`` pairs of a parameter file (``--parameter-file``): a YAML (or JSON, which is
    YAML) mapping of parameter names to scalars. Booleans are written as Argo spells them
    (``true``/``false``). Exit 2 naming the file and what is wrong (not YAML, not a mapping, a value
    that is a list or mapping)."""
    if path is None:
        return ()
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        fail(f"--parameter-file {path}: not YAML or JSON: {e}", "write one `name: value` a line, e.g. epochs: 5", code=2)
    if doc is None:
        return ()
    if not isinstance(doc, dict):
        fail(f"--parameter-file {path}: a {type(doc).__name__}, not a mapping of parameter names to values",
             "write one `name: value` a line, e.g. epochs: 5", code=2)
    pairs = []
    for key, value in doc.items():
        if isinstance(value, (list, dict)) or value is None:
            fail(f"--parameter-file {path}: parameter {key!r} is {'empty' if value is None else 'a ' + type(value).__name__}, not a single value",
                 "each parameter takes one value: a string or a number, e.g. epochs: 5", code=2)
        pairs.append(f"{key}={str(value).lower() if isinstance(value, bool) else value}")
    return tuple(pairs)


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
    """``--namespace/-n`` and ``--context`` of commands that talk to the cluster. The command gets
    the namespace resolved as kubectl does: ``-n``, else ``$PIPECTL_NAMESPACE``, else the site
    file's ``namespace``, else the namespace of the kubeconfig context (``--context`` or the current one), else ``pipectl``. A context's
    ``default`` counts as none: kubectl cannot tell an explicit ``default`` from an unset one (many
    generated kubeconfigs write it), and nothing of pipectl lives there (``-n default`` still
    works). An unknown ``--context`` exits 2 naming the contexts there are (never a fallback to
    in-cluster credentials)."""

    @functools.wraps(fn)
    def resolved(*args: Any, namespace: str | None, context: str | None, **kwargs: Any) -> Any:
        from pipectl.components.names import DEFAULT_NAMESPACE
        from pipectl.pipelines.backends.kube import kubeconfig_context

        if namespace is None or context:  # an unknown --context exits 2 even with -n
            context_namespace = kubeconfig_context(context)[1]
            namespace = (namespace or site_namespace() or (context_namespace if context_namespace != "default" else None)
                         or DEFAULT_NAMESPACE)
        return fn(*args, namespace=namespace, context=context, **kwargs)

    resolved = click.option("--namespace", "-n", default=None, envvar="PIPECTL_NAMESPACE",
                            help="Namespace [default: the site file's, else the kubeconfig context's, else pipectl].")(resolved)
    return click.option("--context", default=None, help="kubeconfig context (default: current).")(resolved)


def parse_overrides(pairs: Sequence[str]) -> dict[str, str]:
    """``("epochs=5", ...)`` -> ``{"epochs": "5"}``; exit 2 naming a pair without ``=``."""
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            fail(f"parameter {pair!r} is not key=value", "write -p epochs=5", code=2)
        key, value = pair.split("=", 1)
        out[key.strip()] = value
    return out


def training_parameters(pairs: Sequence[str], parameter_file: Path | None = None, pipeline: Any = None) -> Any:
    """Validate the pipeline's own defaults, then ``--parameter-file``, then ``-p`` overrides (the
    last wins) against :class:`TrainingParameters` and the pipeline's own parameters; exit 2 with
    every problem named."""
    from pydantic import ValidationError

    from pipectl.components.contracts import TrainingParameters

    model = pipeline.parameter_model() if pipeline is not None else TrainingParameters
    overrides = {**(pipeline.default_arguments() if pipeline is not None else {}),
                 **parse_overrides(parameter_file_pairs(parameter_file)), **parse_overrides(pairs)}
    try:
        return model.from_overrides(overrides)
    except ValueError as e:
        if isinstance(e, ValidationError):
            problems = "; ".join(
                f"{'.'.join(str(x).replace('_', '-') for x in err['loc'])}: {err['msg']}"
                + (f" (got {err['input']!r})" if "input" in err else "")
                for err in e.errors()
            )
            ctx = click.get_current_context(silent=True)  # the command in use: run or submit
            command = ctx.command_path if ctx is not None else "pipectl submit"
            fail(f"invalid parameter: {problems}", f"`{command} PIPELINE --help` lists each parameter's type, bounds and values", code=2)
        fail(str(e), "parameters are the WorkflowTemplate arguments, e.g. -p epochs=5 -p lane=urgent", code=2)


SITE_META = "pipectl.site"
"""Where the root group keeps the site file (``--site`` or ``$PIPECTL_SITE``) for its commands."""


def site_file() -> Path | None:
    """The site file of this invocation, if one was given."""
    ctx = click.get_current_context(silent=True)
    return ctx.meta.get(SITE_META) if ctx is not None else None


def site_namespace() -> str | None:
    """The namespace the site file sets, if it sets one."""
    from pipectl.pipelines.site import load_site

    path = site_file()
    value = load_site(path).get("namespace") if path is not None else None
    return value if isinstance(value, str) else None


def compile_config(bucket: str | None = None, launcher: str | None = None, **fields: Any) -> Any:
    """The :class:`CompileConfig` of the site file (if any) with a command's options on top (None:
    not given); exit 2 naming a bad value and where it came from."""
    from pipectl.pipelines.site import site_config

    given = {"bucket": bucket, "launcher": launcher, **fields}
    return site_config(site_file(), **{k: v for k, v in given.items() if v is not None})
