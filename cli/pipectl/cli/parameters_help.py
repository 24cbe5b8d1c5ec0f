"""``pipectl submit PIPELINE --help`` (and ``run``): the pipeline's parameters, with their type,
bounds, default, choices and description, taken from what the pipeline renders (its
WorkflowTemplate's arguments, so a pipeline's own defaults show) and the parameters' contract."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

import click

HELP_PIPELINE = "pipectl.help_pipeline"
"""``ctx.meta`` key: the PIPELINE argument given together with ``--help``."""


@dataclass(frozen=True)
class ParameterHelp:
    name: str
    kind: str
    default: str
    description: str


def _number(value: float) -> str:
    return f"{value:,}" if float(value).is_integer() else f"{value:g}"


def kind_of(field: Any) -> str:
    """``integer, 1 to 1,000``, ``number, > 0, < 1``, ``one of a|b``, ``text``: a contract field's type and bounds."""
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + "|".join(str(m.value) for m in annotation)
    kind = {int: "integer", float: "number", bool: "true|false", str: "text"}.get(annotation, str(annotation))
    bound = {op: _number(getattr(m, op)) for m in field.metadata for op in ("ge", "gt", "le", "lt")
             if getattr(m, op, None) is not None}
    if "ge" in bound and "le" in bound:
        return f"{kind}, {bound['ge']} to {bound['le']}"
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    return ", ".join([kind] + [f"{words[op]} {value}" for op, value in bound.items()])


def pipeline_parameters(ref: str) -> list[ParameterHelp]:
    """The parameters of the pipeline ``ref`` names (exit 2 for a bad reference, as everywhere)."""
    from pipectl.cli.common import compile_config
    from pipectl.cli.pipeline_ref import load_pipeline

    pipeline = load_pipeline(ref)
    template = pipeline.build(compile_config()).to_dict()
    fields = pipeline.parameter_model().model_fields
    rows = []
    for p in template["spec"]["arguments"]["parameters"]:
        field = fields.get(p["name"].replace("-", "_"))
        rows.append(ParameterHelp(p["name"], kind_of(field) if field else "text", str(p.get("value", "")),
                                  " ".join(str(p.get("description", "")).split())))
    return rows


def first_argument(command: click.Command, args: Sequence[str]) -> str | None:
    """The first positional argument of ``args`` (skipping the values of ``command``'s options)."""
    takes_value = {name for p in command.params if isinstance(p, click.Option) and not p.is_flag for name in p.opts}
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg.startswith("-"):
            skip = arg in takes_value
        else:
            return arg
    return None


class PipelineCommand(click.Command):
    """A command whose argument is a PIPELINE: ``COMMAND PIPELINE --help`` lists that pipeline's parameters."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if any(a in ctx.help_option_names for a in args):
            ctx.meta[HELP_PIPELINE] = first_argument(self, args)
        return super().parse_args(ctx, args)

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_help(ctx, formatter)
        ref = ctx.meta.get(HELP_PIPELINE)
        if not ref:
            formatter.write_paragraph()
            formatter.write_text(f"`pipectl {ctx.info_name} PIPELINE --help` lists the pipeline's parameters.")
            return
        with formatter.section(f"Parameters of {ref} (-p NAME=VALUE, or in --parameter-file)"):
            formatter.write_dl([(p.name, f"{p.description} [{p.kind}; default: {p.default}]")
                                for p in pipeline_parameters(ref)])
