"""Cluster commands: submit, templates (apply, list, get, delete), cron, list, status, wait, logs, retry, stop,
terminate, delete.

Parse, call :mod:`pipectl.pipelines.backends.kube`, print. Objects come from the compile layer
(:mod:`pipectl.pipelines.workflows`, :mod:`pipectl.pipelines.training`) and are validated (typed
parameters, then schema) before anything is sent; ``--dry-run`` prints exactly the object that
would be sent.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from pipectl.cli.parameters_help import PipelineCommand
from pipectl.cli.common import (
    cluster_options,
    compile_config,
    console,
    fail,
    image_config,
    image_options,
    lane_option,
    listing_output_option,
    parameter_option,
    training_parameters,
)
from pipectl.components.names import LANE_LABEL

def _cluster(namespace: str, context: str | None) -> Any:
    from pipectl.pipelines.backends.kube import ArgoCluster

    return ArgoCluster(namespace, context)


def _check(objects: list[dict]) -> None:
    from pipectl.pipelines.lint import lint_objects

    findings = lint_objects([("submit", o) for o in objects])
    if findings:
        fail("; ".join(str(f) for f in findings[:5]), "this is a pipectl bug if the object was rendered by pipectl", code=2)


def _print_objects(objects: list[dict]) -> None:
    import yaml

    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@click.command(cls=PipelineCommand)
@click.argument("pipeline")
@parameter_option
@lane_option
@click.option("--dry-run", is_flag=True, help="Print the Workflow that would be created; send nothing.")
@click.option("--wait", is_flag=True, help="Follow the workflow; exit 1 unless it Succeeded.")
@click.option("--log", "follow_log", is_flag=True,
              help="Follow the logs of every pod of the run (steps and gang pods, each line prefixed with its pod) "
                   "until it ends, as `argo submit --log`; then each step's outcome; exit 1 unless it Succeeded.")
@click.option("--name", "wf_name", default=None, help="The workflow's name (default: generated, <pipeline>-xxxxx).")
@click.option("--labels", default="", help="Labels to add, k=v[,k=v...] (e.g. team=vision,ticket=ml-142).")
@cluster_options
@listing_output_option
def submit(pipeline: str, params: tuple[str, ...], parameter_file: Any, lane: str | None, dry_run: bool, wait: bool,
           follow_log: bool, wf_name: str | None, labels: str, namespace: str, context: str | None, output_format: str) -> None:
    """Submit PIPELINE: a Workflow referencing its WorkflowTemplate (put there by `pipectl templates
    apply PIPELINE`), with validated parameters (--parameter-file, then -p, then --lane: the last wins).

    PIPELINE: a built-in pipeline (training), or your own: path/to/file.py:NAME or package.module:NAME.

    A dataset whose size is known before the run (staged by `pipectl data push`, or shards you already
    have) is measured in the store named by PIPECTL_S3_ENDPOINT (keys: PIPECTL_S3_ACCESS_KEY,
    PIPECTL_S3_SECRET_KEY) and refused (exit 2) when it is over the lane's maximum (site setting
    lane_dataset_max); any other dataset is measured by the run's stage step.

    \b
    Example:
      pipectl submit training -p epochs=20 --log"""
    from pipectl.cli.pipeline_ref import load_pipeline
    from pipectl.pipelines.workflows import workflow_for

    chosen = load_pipeline(pipeline)
    from pipectl.components.names import template_name

    template = template_name(chosen.name)
    parameters = training_parameters(params + ((f"lane={lane}",) if lane else ()), parameter_file, chosen)
    _refuse_local_dataset(pipeline, parameters.dataset_uri)
    _refuse_dataset_over_lane(chosen, parameters)
    wf = _named_and_labelled(workflow_for(template, namespace, parameters), wf_name, labels)
    _check([wf])
    if dry_run:
        _print_objects([wf])
        return
    cluster = _cluster(namespace, context)
    _refuse_gang_over_quota(cluster, parameters)
    created = cluster.create_workflow(wf)
    name = created["metadata"]["name"]
    console().print(f"submitted workflow {name} (lane {parameters.lane.value}, priority {wf['spec']['priority']})")
    record = {"name": name, "namespace": namespace, "lane": parameters.lane.value, "priority": wf["spec"]["priority"]}
    if not (wait or follow_log):
        _record(record, output_format, text=name)
        return
    final = _follow_logs(cluster, name) if follow_log else _follow(cluster, name)
    phase = final.get("status", {}).get("phase")
    _record({**record, "phase": phase, "message": final.get("status", {}).get("message")}, output_format, text=f"{name} {phase}")
    if phase != "Succeeded":
        sys.exit(1)


def _refuse_gang_over_quota(cluster: Any, parameters: Any) -> None:
    """Exit 2, sending nothing, when the namespace's quotas can never admit the run's gang."""
    from pipectl.pipelines.admission import quota_refusal

    quotas = cluster.resource_quotas()
    why = quota_refusal(quotas or [], parameters.lane.value, parameters.workers, parameters.gpus_per_worker)
    if why:
        named = " (the site setting named above)" if "(site setting " in why else ""
        fail(why, f"use fewer workers or GPUs per worker, or ask the namespace's admin for a larger quota{named}", code=2)


def _refuse_dataset_over_lane(pipeline: Any, parameters: Any) -> None:
    """Exit 2, sending nothing, when the dataset's size is known now (staged, or shards the team
    already has) and is over the lane's maximum. Needs the store's settings (``PIPECTL_S3_*``); a
    store that cannot be read here leaves the check to the run's first step, and says so."""
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.datasize import DatasetTooLarge, check_dataset_size, known_size
    from pipectl.components.runtime import s3_client

    settings = StoreSettings()
    uri = parameters.dataset_uri
    if not uri.startswith("s3://") or not (settings.s3_endpoint or settings.s3_access_key):
        return
    try:
        size = known_size(s3_client(settings), uri, prebuilt=any(s.name == "shards" for s in pipeline.steps))
    except Exception as e:  # the store's errors are many (botocore, a damaged index): the step reports them
        console().print(f"note: the size of {uri} was not checked here ({type(e).__name__}: {str(e)[:200]}); "
                        "the run checks it before copying anything", markup=False, style="dim", soft_wrap=True)
        return
    if size is None:
        return
    try:
        check_dataset_size(size, parameters.lane, compile_config().dataset_maxima())
    except DatasetTooLarge as e:
        fail(e.headline, e.hint, code=2)


_LABEL_KEY = r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_LABEL_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?"
_DNS_NAME = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"


def _named_and_labelled(wf: dict, name: str | None, labels: str) -> dict:
    """``wf`` with ``--name`` (in place of its generated name) and ``--labels`` added; exit 2 for a
    name or label Kubernetes would refuse, or a label pipectl sets itself."""
    import re

    if name is not None:
        if not re.fullmatch(_DNS_NAME, name):
            fail(f"--name {name!r} is not a valid workflow name", "lower-case letters, digits and '-', at most 63, "
                 "starting and ending alphanumeric", code=2)
        wf["metadata"].pop("generateName", None)
        wf["metadata"]["name"] = name
    for pair in filter(None, (p.strip() for p in labels.split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not re.fullmatch(_LABEL_KEY, key) or len(key.rpartition("/")[2]) > 63 or not re.fullmatch(_LABEL_VALUE, value):
            fail(f"--labels: {pair!r} is not a Kubernetes label", "write key=value, e.g. team=vision "
                 "(value: at most 63 letters, digits, '-', '_', '.')", code=2)
        if key in wf["metadata"]["labels"]:
            fail(f"--labels: {key} is set by pipectl", "choose another key", code=2)
        wf["metadata"]["labels"][key] = value
    return wf


REMOTE_DATASETS = ("s3://", "example:")
"""What a step pod can read as ``dataset-uri``: the store, or the example shipped in the image."""


def _refuse_local_dataset(pipeline: str, uri: str) -> None:
    """Exit 2 for a ``dataset-uri`` that names this machine's files: no pod of the run can see them."""
    if not uri.startswith(REMOTE_DATASETS):
        team = compile_config().own_team()  # a team's key writes under its prefix only
        to = f" --to {team.s3_prefix}" if team is not None else ""
        fail(f"dataset-uri {uri!r} is a path on this machine: the pipeline's pods cannot read it",
             f"push it to the store first: pipectl submit {pipeline} -p dataset-uri=$(pipectl data push {uri}{to})", code=2)


@click.group()
def templates() -> None:
    """WorkflowTemplates on the cluster."""


@templates.command("apply")
@click.argument("pipelines", nargs=-1, metavar="[PIPELINE]...")
@click.option("--dry-run", is_flag=True)
@image_options
@cluster_options
def templates_apply(pipelines: tuple[str, ...], dry_run: bool, registry: str | None, images: tuple[str, ...],
                    namespace: str, context: str | None) -> None:
    """Apply the WorkflowTemplate of each PIPELINE (default: the built-in ones), linted first.
    PIPELINE: a built-in name, path/to/file.py:NAME or package.module:NAME. Deploy a build with the
    digests `make images-push` printed: --image step-light=sha256:... --image step-train=sha256:...

    A server-side apply as field manager pipectl, taking over fields set before by kubectl or an
    edit: the template's spec ends as rendered; labels and annotations other tools add stay.

    Each template's own parameters (Pipeline(parameters=...)) are written to the namespace's
    ConfigMap pipectl-parameter-rules too, under a field manager of the template's own: the
    cluster's submission policy admits those arguments by them (a parameter the template no
    longer has loses its keys)."""
    from pipectl.cli.pipeline_ref import load_pipeline
    from pipectl.pipelines.admission import parameter_rules_data
    from pipectl.pipelines.builtin import PIPELINES

    cfg = compile_config(namespace=namespace, **image_config(registry, images))
    chosen = [load_pipeline(ref) for ref in pipelines] or list(PIPELINES.values())
    built = [(p, p.build(cfg).to_dict()) for p in chosen]
    try:
        rules = {t["metadata"]["name"]: parameter_rules_data(t["metadata"]["name"], p.parameter_specs()) for p, t in built}
    except ValueError as e:
        fail(str(e), "shorten the pipeline's or the parameter's name", code=2)
    _apply([t for _, t in built], dry_run, namespace, context, parameter_rules=rules)


@templates.command("list")
@cluster_options
@listing_output_option
def templates_list(namespace: str, context: str | None, output_format: str) -> None:
    """The namespace's WorkflowTemplates: name, title, parameters, created."""
    rows = [{"name": t["metadata"]["name"],
             "title": t["metadata"].get("annotations", {}).get("workflows.argoproj.io/title", ""),
             "parameters": len((t["spec"].get("arguments") or {}).get("parameters") or []),
             "created": t["metadata"].get("creationTimestamp")}
            for t in _cluster(namespace, context).list("workflowtemplates")]
    _rows(rows, output_format, narrow=("name", "title", "parameters", "created"))


def _get_and_delete(group: click.Group, plural: str, kind: str, get_doc: str, delete_doc: str) -> None:
    """``get NAME`` (the object as the cluster holds it, yaml or json) and ``delete NAMES...`` of
    ``plural`` in ``group`` (as ``argo template get|delete``, ``argo cron get|delete``)."""

    @group.command("get", help=get_doc)
    @click.argument("name")
    @click.option("--output", "-o", "output_format", type=click.Choice(("yaml", "json")), default="yaml", show_default=True)
    @cluster_options
    def get(name: str, output_format: str, namespace: str, context: str | None) -> None:
        _print_object(_cluster(namespace, context).get(plural, name), output_format)

    @group.command("delete", help=delete_doc)
    @click.argument("names", nargs=-1, required=True)
    @cluster_options
    def delete(names: tuple[str, ...], namespace: str, context: str | None) -> None:
        _delete_each(plural, kind, names, namespace, context)


def _print_object(obj: dict, output_format: str) -> None:
    obj = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
    if output_format == "json":
        click.echo(json.dumps(obj, indent=2))
    else:
        _print_objects([obj])


def _delete_each(plural: str, kind: str, names: tuple[str, ...], namespace: str, context: str | None) -> None:
    cluster = _cluster(namespace, context)
    for name in names:
        cluster.delete(plural, name)
        if plural == "workflowtemplates":  # its own parameters' rules go with it
            cluster.remove_parameter_rules(name)
        console().print(f"deleted {kind} {name}")
        click.echo(name)


@click.group()
def cron() -> None:
    """Scheduled retraining (CronWorkflows)."""


_get_and_delete(templates, "workflowtemplates", "WorkflowTemplate", "The WorkflowTemplate NAME as the cluster holds it.",
                "Delete WorkflowTemplates NAMES and their parameters' keys in ConfigMap pipectl-parameter-rules; "
                "running workflows keep the copy they started with.")
_get_and_delete(cron, "cronworkflows", "CronWorkflow",
                "The CronWorkflow NAME as the cluster holds it (schedule, status: last run, active runs).",
                "Delete CronWorkflows NAMES (their past runs stay).")


@cron.command("apply")
@click.argument("pipeline", default="training")
@click.option("--dry-run", is_flag=True)
@cluster_options
def cron_apply(pipeline: str, dry_run: bool, namespace: str, context: str | None) -> None:
    """Apply the daily schedule of PIPELINE (default: training): CronWorkflow `retrain` for the
    built-in training pipeline, `retrain-<name>` for another. It runs the WorkflowTemplate
    `<name>-v1` that `pipectl templates apply PIPELINE` puts on the cluster. A server-side apply as
    field manager pipectl; a suspended schedule stays suspended.

    PIPELINE: a built-in pipeline (training), or your own: path/to/file.py:NAME or package.module:NAME."""
    from pipectl.cli.pipeline_ref import load_pipeline
    from pipectl.pipelines.manifests import retrain_cron

    chosen = load_pipeline(pipeline)
    _apply([retrain_cron(compile_config(namespace=namespace), chosen.name).to_dict()], dry_run, namespace, context)


@cron.command("list")
@cluster_options
@listing_output_option
def cron_list(namespace: str, context: str | None, output_format: str) -> None:
    rows = [
        {"name": c["metadata"]["name"], "schedules": c["spec"].get("schedules"), "timezone": c["spec"].get("timezone"),
         "suspended": bool(c["spec"].get("suspend")), "last": c.get("status", {}).get("lastScheduledTime"),
         "template": (c["spec"].get("workflowSpec") or {}).get("workflowTemplateRef", {}).get("name"),
         "concurrency": c["spec"].get("concurrencyPolicy")}
        for c in _cluster(namespace, context).list("cronworkflows")
    ]
    _rows(rows, output_format, narrow=("name", "schedules", "timezone", "suspended", "last"))


def _suspend(name: str, namespace: str, context: str | None, value: bool) -> None:
    _cluster(namespace, context).patch("cronworkflows", name, {"spec": {"suspend": value}})
    console().print(f"{'suspended' if value else 'resumed'} CronWorkflow {name}")


@cron.command("suspend")
@click.argument("name")
@cluster_options
def cron_suspend(name: str, namespace: str, context: str | None) -> None:
    _suspend(name, namespace, context, True)


@cron.command("resume")
@click.argument("name")
@cluster_options
def cron_resume(name: str, namespace: str, context: str | None) -> None:
    _suspend(name, namespace, context, False)


@cron.command("trigger")
@click.argument("name")
@cluster_options
def cron_trigger(name: str, namespace: str, context: str | None) -> None:
    """Run the CronWorkflow NAME now: exactly one Workflow from its workflowSpec."""
    from pipectl.pipelines.workflows import cron_trigger_workflow

    cluster = _cluster(namespace, context)
    wf = cluster.create_workflow(cron_trigger_workflow(cluster.get("cronworkflows", name)))
    click.echo(wf["metadata"]["name"])


PHASES = ("Pending", "Running", "Succeeded", "Failed", "Error")


def _duration_s(text: str) -> float:
    """``90s``, ``30m``, ``2h``, ``7d`` (or plain seconds) in seconds; BadParameter otherwise."""
    import re

    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd]?)", text.strip())
    if not m:
        raise click.BadParameter(f"{text!r} is not a duration: write e.g. 90s, 30m, 2h or 7d")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


@click.command("list")
@click.option("--status", "-s", "statuses", multiple=True, type=click.Choice(PHASES, case_sensitive=False),
              help="Only workflows in this phase (repeatable).")
@click.option("--selector", "-l", default="", help="Label selector, as kubectl's -l (e.g. pipectl.io/lane=urgent).")
@click.option("--since", default=None, help="Only workflows created within this long (90s, 30m, 2h, 7d).")
@click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace's (a NAMESPACE column).")
@cluster_options
@listing_output_option
def list_(statuses: tuple[str, ...], selector: str, since: str | None, all_namespaces: bool, namespace: str,
          context: str | None, output_format: str) -> None:
    """Workflows of pipectl in the namespace, newest first: submitted, resubmitted and
    cron-triggered (the column `cron` names the CronWorkflow; -o wide).

    \b
    Example:
      pipectl list -s Failed --since 1d -l pipectl.io/lane=urgent
    """
    import datetime as dt

    from pipectl.components.names import PART_OF, TEMPLATE_NAME
    from pipectl.pipelines.workflows import CRON_LABEL, TEMPLATE_LABEL

    cluster = _cluster(namespace, context)
    extra = f",{selector}" if selector else ""
    items = cluster.list("workflows", ",".join(f"{k}={v}" for k, v in PART_OF.items()) + extra, all_namespaces=all_namespaces)
    # Runs the Argo controller started from a CronWorkflow carry its label, and pipectl's label
    # only when the CronWorkflow's workflowMetadata sets it (retrain does): a cron
    # run of our template counts either way.
    ours = {w["metadata"]["uid"] for w in items}
    items += [w for w in cluster.list("workflows", CRON_LABEL + extra, all_namespaces=all_namespaces)
              if w["metadata"]["uid"] not in ours and (w["spec"].get("workflowTemplateRef") or {}).get("name") == TEMPLATE_NAME]
    if statuses:
        wanted = {s.lower() for s in statuses}
        items = [w for w in items if w.get("status", {}).get("phase", "Pending").lower() in wanted]
    if since is not None:
        cutoff = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=_duration_s(since))).strftime("%Y-%m-%dT%H:%M:%SZ")
        items = [w for w in items if w["metadata"].get("creationTimestamp", "") >= cutoff]
    items.sort(key=lambda w: w["metadata"].get("creationTimestamp", ""), reverse=True)

    def lane(w: dict) -> str | None:
        given = {p.get("name"): p.get("value") for p in (w["spec"].get("arguments") or {}).get("parameters") or []}
        return w["metadata"].get("labels", {}).get(LANE_LABEL) or given.get("lane")

    _rows([{**({"namespace": w["metadata"]["namespace"]} if all_namespaces else {}),
            "name": w["metadata"]["name"], "phase": w.get("status", {}).get("phase", "Pending"), "lane": lane(w),
            "started": w.get("status", {}).get("startedAt"), "finished": w.get("status", {}).get("finishedAt"),
            "cron": w["metadata"].get("labels", {}).get(CRON_LABEL),
            "template": (w["spec"].get("workflowTemplateRef") or {}).get("name") or w["metadata"].get("labels", {}).get(TEMPLATE_LABEL),
            "priority": w["spec"].get("priority"), "message": w.get("status", {}).get("message")}
           for w in items], output_format, narrow=(("namespace",) if all_namespaces else ()) + ("name", "phase", "lane", "started"))


@click.command()
@click.argument("name")
@cluster_options
@listing_output_option
def status(name: str, namespace: str, context: str | None, output_format: str) -> None:
    """Phase of workflow NAME and of each of its steps (exit 1 when it Failed; -o name prints just
    NAME, for scripts that want the exit status)."""
    cluster = _cluster(namespace, context)
    wf = cluster.get("workflows", name)
    nodes = sorted((wf.get("status", {}).get("nodes") or {}).values(), key=lambda n: n.get("startedAt") or "")
    rows = [{"step": n.get("displayName"), "type": n.get("type"), "phase": n.get("phase"), "message": n.get("message", ""),
             "node": n.get("hostNodeName"), "started": n.get("startedAt"), "finished": n.get("finishedAt"), "id": n.get("id")}
            for n in nodes if n.get("type") in ("Pod", "Retry", "DAG")]
    if output_format == "name":
        click.echo(name)
    else:
        _rows(rows, output_format, narrow=("step", "type", "phase", "message"))
    phase = wf.get("status", {}).get("phase")
    for line in _training_anatomy(nodes) or _live_anatomy(name, nodes):
        console().print(line, markup=False, soft_wrap=True)
    console().print(f"workflow {name}: {phase}", markup=False)
    if phase in ("Failed", "Error"):
        # a train step that timed out Pending: say why its gang never got nodes
        for pod, why in cluster.unscheduled_gang_pods(name).items():
            console().print(f"gang pod {pod} was never scheduled: {why}", markup=False)
        for why in cluster.gang_creation_failures(name):  # pods the job could not create (a quota)
            console().print(why, markup=False)
        sys.exit(1)


def _training_anatomy(nodes: list[dict]) -> list[str]:
    """The training's step time and verdicts, as the evaluate step's outputs carry them."""
    for node in nodes:
        outputs = {p["name"]: p.get("value", "") for p in (node.get("outputs") or {}).get("parameters", [])}
        if outputs.get("training-step-time"):
            import json

            verdicts = json.loads(outputs.get("training-verdicts") or "[]")
            return [f"training step time (last epoch): {outputs['training-step-time']}", *(f"verdict: {v}" for v in verdicts)]
    return []


def _live_anatomy(name: str, nodes: list[dict]) -> list[str]:
    """While the training runs (or when it ended before evaluate): its latest epoch's step time and
    verdicts, from the tags its rank 0 sets on the MLflow run at each epoch's end; nothing when the
    workflow has no train step or no MLflow address is known; a line saying why when MLflow cannot
    be read."""
    if not any((n.get("displayName") or "").startswith("train") for n in nodes):
        return []
    uri = _mlflow_uri()
    if not uri:
        return []
    from pipectl.components.train.live import read

    lines, problem = read(uri, name)
    return lines or ([problem] if problem else [])


@click.command()
@click.argument("name")
@click.option("--follow", "-f", is_flag=True, help="Stream the logs while they are written, new pods included, until the workflow ends.")
@click.option("--step", default="", help="Only this step's pods (validate, stage, preprocess, train, evaluate, register, or your own).")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="Only the last N lines of each pod's log.")
@click.option("--since", default=None, help="Only lines written within this long (90s, 30m, 2h).")
@cluster_options
def logs(name: str, follow: bool, step: str, tail: int | None, since: str | None, namespace: str, context: str | None) -> None:
    """Logs of every pod of workflow NAME (steps and gang pods). With -f, lines are prefixed
    with their pod's name (pods run side by side), as `argo logs -f` does.

    \b
    Example:
      pipectl logs training-x7k2p --step train --tail 50
    """
    window = {k: v for k, v in (("tail_lines", tail), ("since_seconds", since and max(1, int(_duration_s(since))))) if v is not None}
    cluster = _cluster(namespace, context)
    if follow:
        final = _stream_logs(cluster, name, step=step, **window)
        console().print(f"workflow {name}: {final.get('status', {}).get('phase')}", markup=False)
        return
    for pod, text in cluster.logs(name, step, **window):
        click.echo(f"==> {pod} <==")
        click.echo(text, nl=not text.endswith("\n"))


def _stream_logs(cluster: Any, name: str, step: str = "", **window: Any) -> dict:
    """Every log line of workflow ``name``'s pods on stdout as ``<pod>: <line>`` while they are
    written (pods run side by side), until the workflow has ended; returns the ended workflow."""
    import threading

    lock = threading.Lock()

    def emit(pod: str, line: str) -> None:
        with lock:
            click.echo(f"{pod}: {line}")

    return cluster.follow_logs(name, emit, step=step, **window)


def _follow_logs(cluster: Any, name: str) -> dict:
    """`submit --log`: the run's logs as they are written (:func:`_stream_logs`), then on stderr each
    step's outcome with its duration and the workflow's links, as `submit --wait` ends."""
    from rich.text import Text

    final = _stream_logs(cluster, name)
    out = console()
    for node in _step_nodes(final):
        out.print(Text.from_markup(_MARKS.get(node.get("phase", ""), "…")) + Text(f" {_step_line(node)}"), soft_wrap=True)
    for line in _workflow_links(final, getattr(cluster, "namespace", ""), _argo_server_base(), _mlflow_uri()):
        out.print(line, markup=False, soft_wrap=True)
    return final


def _shutdown_command(strategy: str, doc: str) -> click.Command:
    @click.command(strategy.lower(), help=doc)
    @click.argument("names", nargs=-1, required=True)
    @cluster_options
    def command(names: tuple[str, ...], namespace: str, context: str | None) -> None:
        cluster = _cluster(namespace, context)
        for name in names:
            cluster.shutdown(name, strategy)
            console().print(f"workflow {name}: {strategy.lower()} requested ({'exit handlers run' if strategy == 'Stop' else 'no exit handler runs'})")
            if strategy == "Terminate":  # no exit handler runs: end the gang here
                for job in cluster.release_gangs(name):
                    console().print(f"deleted gang job {job}; no gang pod of {name} is left")
            click.echo(name)

    return command


stop = _shutdown_command("Stop", """Stop workflows NAMES as `argo stop` does: running steps are ended
    and the exit handlers RUN (spec.shutdown=Stop). Exit 2 for a workflow that has already ended.""")
terminate = _shutdown_command("Terminate", """Terminate workflows NAMES as `argo terminate` does: running
    steps are ended and NO exit handler runs (spec.shutdown=Terminate); pipectl then deletes the
    workflow's gang jobs itself and waits until their pods are gone (a stopped workflow's exit
    handler does the same). Exit 2 for a workflow that has already ended.""")


@click.command()
@click.argument("names", nargs=-1, required=True)
@cluster_options
def delete(names: tuple[str, ...], namespace: str, context: str | None) -> None:
    """Delete workflows NAMES (as `argo delete`): the Workflow and what it owns (pods, gang jobs).
    A running workflow is deleted too; stop it first to run its exit handlers."""
    _delete_each("workflows", "workflow", names, namespace, context)


@click.command()
@click.argument("name")
@click.option("--resubmit", is_flag=True, hidden=True)  # refused with the command to use instead
@cluster_options
def retry(name: str, resubmit: bool, namespace: str, context: str | None) -> None:
    """Retry workflow NAME in place, as `argo retry` and the Argo UI's RETRY do.

    The same workflow runs again from where it failed: only its failed steps run again,
    succeeded steps keep their outputs, and training resumes from the run's checkpoints. A failed
    gang job of the run is deleted first (the retried step creates it again). Only a workflow
    that ended Failed or Error can be retried.

    \b
    In-place retry goes through the Argo Server, found as the `argo` CLI finds it:
      ARGO_SERVER=host:port (with ARGO_SECURE, ARGO_INSECURE_SKIP_VERIFY, ARGO_TOKEN),
      else the site file's argo_ui (the Argo Server serves the UI and its API).
    When neither is set, or the workflow cannot be retried, nothing is changed: the
    error says why and what to do (exit 2). Exit 3: the Argo Server or the API server
    is unreachable or refuses the credentials.

    \b
    A new run with the same template and arguments instead: pipectl resubmit NAME.
    """
    from pipectl.pipelines.backends.kube import ArgoServer

    if resubmit:
        fail("retry only retries in place (the same workflow, from where it failed)",
             f"for a new run with the same arguments: pipectl resubmit {name}", code=2)
    cluster = _cluster(namespace, context)
    phase = cluster.get("workflows", name).get("status", {}).get("phase")
    if phase == "Succeeded":
        fail(f"workflow {name} Succeeded: there is nothing to retry in place",
             f"for a new run with the same arguments: pipectl resubmit {name}", code=2)
    if phase not in ("Failed", "Error"):
        fail(f"workflow {name} is {phase or 'not started'}: only a workflow that ended Failed or Error can be retried",
             f"wait for it to end (pipectl wait {name}), or stop it (pipectl stop {name}) and retry it then", code=2)
    # ARGO_SERVER first; the site file is read only without it (a bad one exits 2 naming it)
    server = ArgoServer.from_env() or ArgoServer.from_env(compile_config().argo_ui)
    if server is None:
        fail(f"workflow {name} can only be retried in place through the Argo Server, and none is configured",
             "set ARGO_SERVER=host:port (and ARGO_SECURE=false for plain http, ARGO_TOKEN when the server wants a "
             "token), as for the argo CLI, or the site file's argo_ui; or press RETRY on the run in the Argo UI. "
             f"For a new run with the same arguments instead: pipectl resubmit {name}", code=2)
    for job in cluster.release_gangs(name, failed_only=True):
        console().print(f"deleted the failed gang job {job} (the retried step creates the run's job again)")
    server.retry(namespace, name)
    console().print(f"retrying {name} in place (Argo Server {server.base})")
    click.echo(name)


ENDED_PHASES = ("Succeeded", "Failed", "Error")


@click.command()
@click.argument("name")
@cluster_options
def resubmit(name: str, namespace: str, context: str | None) -> None:
    """Submit a new run with the template and arguments of workflow NAME, as `argo resubmit`.

    The new Workflow is labelled pipectl.io/retry-of=NAME and prints its name on stdout;
    training starts afresh (stage and register are idempotent). The old run's gang jobs are
    deleted first and their pods waited for (a run terminated from the Argo UI keeps its gang),
    so no gang of the old run holds GPUs beside the new one; a run that has not ended is
    refused (exit 2): stop or terminate it first. To run a failed workflow again from where it
    failed instead: pipectl retry NAME.
    """
    from pipectl.pipelines.workflows import resubmit_workflow

    cluster = _cluster(namespace, context)
    old = cluster.get("workflows", name)
    phase = old.get("status", {}).get("phase")
    if phase not in ENDED_PHASES:
        fail(f"workflow {name} is {phase or 'not started'}: its gang would keep training beside the new run",
             f"stop it first (pipectl stop {name}, or pipectl terminate {name}), then resubmit", code=2)
    if phase != "Succeeded":  # a Succeeded run's completed pods hold nothing and keep their logs
        for job in cluster.release_gangs(name):
            console().print(f"deleted gang job {job} of {name}; no gang pod of {name} is left")
    new_name = cluster.create_workflow(resubmit_workflow(old, namespace))["metadata"]["name"]
    console().print(f"resubmitted {name} as {new_name} (a new Workflow with the same arguments)")
    click.echo(new_name)


def _apply(objs: list[dict], dry_run: bool, namespace: str, context: str | None,
           parameter_rules: dict[str, dict[str, str]] | None = None) -> None:
    """Lint ``objs``, then print them (dry run) or apply each on the cluster (server-side); for a
    template named in ``parameter_rules``, its keys of the parameter-rules ConfigMap first."""
    from pipectl.pipelines.admission import PARAMETER_RULES_CONFIGMAP

    _check(objs)
    rules = parameter_rules or {}
    if dry_run:
        _print_objects(objs)
        for name, data in rules.items():
            console().print(f"would write {len(data)} keys of {name} to ConfigMap {PARAMETER_RULES_CONFIGMAP}")
        return
    cluster = _cluster(namespace, context)
    for o in objs:
        name = o["metadata"]["name"]
        if name in rules:
            cluster.apply_parameter_rules(name, rules[name])
            console().print(f"applied {len(rules[name])} parameter rules of {name} to ConfigMap {PARAMETER_RULES_CONFIGMAP}")
        cluster.apply(o)
        console().print(f"applied {o['kind']} {name}")


def _record(record: dict, output_format: str, text: str) -> None:
    """One object's result on stdout: ``text`` (text), its name (name), the record (json, yaml),
    or its values on one line (wide)."""
    if output_format in ("json", "yaml"):
        _rows(record, output_format)
    elif output_format == "wide":
        click.echo(" ".join(str(v) for v in record.values() if v is not None))
    else:
        click.echo(record["name"] if output_format == "name" else text)


def _rows(rows: list[dict] | dict, output_format: str, narrow: tuple[str, ...] = ()) -> None:
    """``rows`` on stdout: a table of the ``narrow`` columns (text; all of them when empty), of
    every column (wide), the rows themselves (json, yaml), or the first column one a line (name)."""
    if output_format == "json":
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    if output_format == "yaml":
        import yaml

        click.echo(yaml.safe_dump(json.loads(json.dumps(rows, default=str)), sort_keys=False), nl=False)
        return
    if output_format == "name":
        for r in rows:
            click.echo(r.get("name", next(iter(r.values()))))
        return
    if not rows:
        console().print("nothing found")
        return
    if narrow and output_format != "wide":
        rows = [{k: r[k] for k in narrow} for r in rows]
    # kubectl's table: upper-case headers, columns padded to their widest cell, nothing cut (a
    # table squeezed to the terminal, or to 80 columns in a pipe, would cut names `grep`/`awk` need)
    header = [k.upper() for k in rows[0]]
    cells = [["" if v is None else ",".join(map(str, v)) if isinstance(v, list) else str(v) for v in r.values()] for r in rows]
    widths = [max(len(c[i]) for c in [header, *cells]) for i in range(len(header))]
    for line in [header, *cells]:
        click.echo("   ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip())


@click.command()
@click.argument("name")
@click.option("--timeout", type=click.FloatRange(min=1), default=None,
              help="Seconds to wait at most; exit 1 if it has not ended by then (it keeps running).")
@cluster_options
@listing_output_option
def wait(name: str, timeout: float | None, namespace: str, context: str | None, output_format: str) -> None:
    """Follow workflow NAME until it ends, each step's phase as it changes (a watch: no change is
    missed); exit 0 if it Succeeded, 1 otherwise.

    \b
    Example:
      pipectl wait training-x7k2p --timeout 3600 && echo trained
    """
    final = _follow(_cluster(namespace, context), name, timeout)
    status = final.get("status", {})
    _record({"name": name, "namespace": namespace, "phase": status.get("phase"), "message": status.get("message"),
             "started": status.get("startedAt"), "finished": status.get("finishedAt")}, output_format,
            text=f"{name} {status.get('phase')}")
    if status.get("phase") != "Succeeded":
        sys.exit(1)


def _follow(cluster: Any, name: str, timeout_s: float | None = None) -> dict:
    """Live per-step progress on stderr until the workflow ends (at most ``timeout_s`` seconds):
    each step's phase as it changes, with its duration once it has finished; at the end, the
    workflow's links (Argo UI, MLflow run) where they are known."""
    from rich.text import Text

    out = console()
    shown: dict[str, str] = {}

    def on_change(wf: dict) -> None:
        for node in _step_nodes(wf):
            key, phase = node.get("displayName", "?"), node.get("phase", "")
            if shown.get(key) != phase:
                shown[key] = phase
                # names and messages are remote text (a parameter value can reach a message): no markup
                out.print(Text.from_markup(_MARKS.get(phase, "…")) + Text(f" {_step_line(node)}"), soft_wrap=True)

    final = cluster.wait(name, on_change, timeout_s)
    for line in _workflow_links(final, getattr(cluster, "namespace", ""), _argo_server_base(), _mlflow_uri()):
        out.print(line, markup=False, soft_wrap=True)
    return final


_MARKS = {"Succeeded": "[green]✓[/]", "Failed": "[red]✗[/]", "Error": "[red]✗[/]"}
"""A step's mark by phase (… while it runs)."""


def _step_nodes(wf: dict) -> list[dict]:
    """The workflow's steps (its Pod and Retry nodes), in the order they started."""
    nodes = (wf.get("status", {}).get("nodes") or {}).values()
    return [n for n in sorted(nodes, key=lambda n: n.get("startedAt") or "") if n.get("type") in ("Pod", "Retry")]


def _step_line(node: dict) -> str:
    """A step's progress line after its mark: name, phase, its duration once it has finished
    (``(3m07s)``), and its message."""
    took = _node_duration(node)
    return " ".join(p for p in (node.get("displayName", "?"), node.get("phase", ""), f"({took})" if took else "",
                                node.get("message", "")) if p)


def _node_duration(node: dict) -> str:
    """How long a finished node ran, from its ``startedAt`` to its ``finishedAt`` (``42s``,
    ``3m07s``, ``2h05m``); "" while it runs or when a time is missing or unreadable."""
    from datetime import datetime

    try:
        started, finished = (datetime.fromisoformat(node[k].replace("Z", "+00:00")) for k in ("startedAt", "finishedAt"))
        s = max(0, round((finished - started).total_seconds()))
    except (KeyError, AttributeError, TypeError, ValueError):
        return ""
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _workflow_links(wf: dict, namespace: str, argo_server: str | None, mlflow_uri: str | None) -> list[str]:
    """The lines `submit --wait` and `wait` end with: the workflow in the Argo UI (when an Argo
    Server is known) and its MLflow run (when the workflow's outputs carry ``mlflow-run-id``, as
    the evaluate step exports it, and an MLflow address is known)."""
    lines = []
    name = wf.get("metadata", {}).get("name", "")
    if argo_server and name:
        from pipectl.pipelines.backends.kube import ArgoServer

        lines.append(f"Argo UI: {ArgoServer(argo_server).workflow_url(wf['metadata'].get('namespace') or namespace, name)}")
    outputs = {p.get("name"): p.get("value") for p in (wf.get("status", {}).get("outputs") or {}).get("parameters") or []}
    run_id = outputs.get("mlflow-run-id")
    if run_id and mlflow_uri:
        # the run's own page, the address the Argo UI's "MLflow run" link opens (argo/ controller config)
        lines.append(f"MLflow run: {mlflow_uri.rstrip('/')}/#/runs/{run_id}")
    return lines


def _argo_server_base() -> str | None:
    """The Argo UI's address: the Argo Server's as the `argo` CLI finds it (``ARGO_SERVER``,
    ``ARGO_SECURE``), else the site file's ``argo_ui``; None when neither is set (or the site file
    cannot be read: the link is left out, the command's outcome stays)."""
    from pipectl.components.errors import PipectlError
    from pipectl.pipelines.backends.kube import ArgoServer

    server = ArgoServer.from_env()
    if server is not None:
        return server.base
    try:
        return compile_config().argo_ui or None
    except PipectlError:
        return None


def _mlflow_uri() -> str | None:
    """The MLflow address of this install's site settings (the one the Argo UI's link uses); None
    when the site file cannot be read (the link is left out, the command's outcome stays)."""
    from pipectl.components.errors import PipectlError

    try:
        return compile_config().mlflow_uri
    except PipectlError:
        return None
