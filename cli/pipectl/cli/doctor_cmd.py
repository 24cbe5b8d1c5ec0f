"""``pipectl doctor``: checks that a cluster and namespace can run pipectl's pipelines
(:mod:`pipectl.pipelines.backends.doctor`), one row per check with a fix; exit 0 when nothing
fails, 1 when a check fails, 3 when the cluster cannot be reached."""

from __future__ import annotations

import json

import click

from pipectl.cli.common import cluster_options, compile_config, console, launcher_option, output_option

_STYLE = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[bold red]fail[/]"}


@click.command()
@click.option("--from-pod", is_flag=True,
              help="Also start one short pod in the namespace, as a step runs: it asks the store and MLflow from the "
                   "step-light image and starts the step-train image (torch, DALI, the training steps imported): shows "
                   "both images can be pulled and started and the services answer the pods.")
@click.option("--pod-timeout", type=click.IntRange(min=10), default=180, show_default=True,
              help="Seconds --from-pod waits for its pod (a first pull of a step image is GBs).")
@cluster_options
@launcher_option
@output_option
def doctor(from_pod: bool, pod_timeout: int, namespace: str, context: str | None, launcher: str | None,
           output_format: str) -> None:
    """Check the cluster and namespace against what pipectl needs: Kubernetes version, Argo and
    gang-launcher CRDs, Argo Workflows' version (asked of the Argo Server when ARGO_SERVER is set,
    else read from the controller's Deployment), what argo/ installs (PriorityClasses, queues,
    admission policies, RBAC, config, the WorkflowTemplate), the store's Secret, GPU nodes,
    Karpenter's NodePools and node class where Karpenter runs, the store and MLflow answering, and the
    team's MLflow credentials against what MLflow asks for.
    The store and MLflow are asked from this machine; --from-pod asks them from a pod of the
    namespace too, and starts both step images there. Prints a fix for each failing row; exit 1 when one fails, 3 when the cluster
    cannot be reached.

    \b
    Example:
      pipectl doctor -n pipectl --from-pod
    """
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException
    from rich.markup import escape
    from rich.table import Table
    from urllib3.exceptions import HTTPError

    from pipectl.pipelines.backends.doctor import Doctor
    from pipectl.pipelines.backends.kube import ArgoCluster, ArgoServer, Unreachable
    from pipectl.pipelines.backends.probe import from_pod as probe_from_pod

    cluster = ArgoCluster(namespace, context)  # loads the kubeconfig (or in-cluster credentials)
    cfg = compile_config(namespace=namespace, launcher=launcher)
    try:
        rows = Doctor(client.ApiClient(), cfg, argo_server=ArgoServer.from_env()).rows()
        if from_pod:
            rows += probe_from_pod(client.ApiClient(), cfg, pod_timeout)
    except (ApiException, HTTPError, OSError) as e:
        raise Unreachable(f"the API server {cluster.host} did not answer the checks: {getattr(e, 'reason', e)}",
                          "check the kubeconfig, the network and your RBAC (read access to CRDs, nodes, the namespace)") from e
    failed = [r for r in rows if r.status == "fail"]
    if output_format == "json":
        click.echo(json.dumps([r.__dict__ for r in rows], indent=2))
    else:
        table = Table(title=f"pipectl doctor: namespace {escape(namespace)}", title_justify="left")
        for col in ("check", "", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for r in rows:
            table.add_row(escape(r.check), _STYLE[r.status], escape(r.detail), escape(r.fix))
        out = console()
        out.print(table)
        out.print(f"{len(failed)} check(s) failed" if failed else "ready: nothing failed")
    if failed:
        raise SystemExit(1)
