"""``pipectl teams``: what a platform admin does for each team of the site file (``teams:``):
``mlflow-user TEAM`` gives the team its own user on an MLflow that runs with basic auth and
writes it into the team's namespace (:mod:`pipectl.pipelines.backends.mlflow_users`);
``store-policy`` holds each team's store key to its prefix (:mod:`pipectl.pipelines.store_policy`)."""

from __future__ import annotations

import json
import os

import click

from pipectl.cli.common import compile_config, console, fail
from pipectl.components.errors import PipectlError
from pipectl.components.names import MLFLOW_PASSWORD_ENV, MLFLOW_SECRET, MLFLOW_USERNAME_ENV


@click.group()
def teams() -> None:
    """Teams sharing the cluster (the site file's teams:): their MLflow users and store policy.

    \b
    Example:
      export MLFLOW_TRACKING_USERNAME=admin MLFLOW_TRACKING_PASSWORD=...   # the MLflow admin
      pipectl --site site.yaml teams mlflow-user vision
      pipectl --site site.yaml teams store-policy --apply                 # as the bucket's owner
    """


def _team(name: str) -> tuple[str, str]:
    """(username, namespace) of the site's team ``name``; exit 2 naming the declared teams."""
    cfg = compile_config()
    declared = {t.name: t for t in cfg.teams}
    if name not in declared:
        known = ", ".join(sorted(declared)) or "none (the site file declares no teams:)"
        fail(f"unknown team {name!r}: the site file's teams are {known}",
             "declare the team under teams: in the site file (--site or $PIPECTL_SITE) and apply argo/cluster first", code=2)
    return name, declared[name].namespace


def _admin() -> str:
    """The MLflow admin's user name from the environment; exit 2 when its credentials are not set."""
    admin, password = os.environ.get(MLFLOW_USERNAME_ENV), os.environ.get(MLFLOW_PASSWORD_ENV)
    if not admin or not password:
        fail(f"{MLFLOW_USERNAME_ENV} and {MLFLOW_PASSWORD_ENV} are not both set: the MLflow admin's credentials are needed",
             f"export {MLFLOW_USERNAME_ENV}=<admin> {MLFLOW_PASSWORD_ENV}=<password> (the server's auth config admin)", code=2)
    return admin


@teams.command("mlflow-user")
@click.argument("team")
@click.option("--mlflow-uri", default=None, help="The MLflow server [default: the site file's mlflow_uri].")
@click.option("--rotate", is_flag=True, default=False,
              help="The user exists: give it a new password and write the Secret again.")
@click.option("--context", default=None, help="kubeconfig context (default: current).")
def mlflow_user(team: str, mlflow_uri: str | None, rotate: bool, context: str | None) -> None:
    """Create TEAM's user on an MLflow that runs MLflow's basic-auth app (a generated password,
    never printed) and write Secret pipectl-mlflow-credentials into the team's namespace: its steps
    then write to MLflow as that user. With the server's default_permission READ, the team writes
    only the experiments and models it created and reads every other team's.

    As the MLflow admin (MLFLOW_TRACKING_USERNAME/PASSWORD) and a kubeconfig that may write Secrets
    in the team's namespace. A user that exists keeps its password unless --rotate. Exit 2 for an
    unknown team or no admin credentials, 3 when MLflow or the API server cannot be reached or
    refuses (not an admin).

    \b
    Example:
      pipectl --site site.yaml teams mlflow-user vision
      pipectl --site site.yaml teams mlflow-user vision --rotate   # a new password
    """
    from pipectl.pipelines.backends.kube import ArgoCluster
    from pipectl.pipelines.backends.mlflow_users import ensure_team_user
    from pipectl.pipelines.teams import mlflow_credentials_secret

    username, namespace = _team(team)
    admin = _admin()
    uri = mlflow_uri or compile_config().mlflow_uri
    cluster = ArgoCluster(namespace, context)
    # the API server checks the write first (namespace, RBAC, admission): a failure changes nothing on MLflow
    cluster.apply_secret(mlflow_credentials_secret(namespace, username, "checked-only"), dry_run=True)
    user = ensure_team_user(uri, username, admin, rotate=rotate)
    out = console()
    if user.password is None:
        out.print(f"MLflow user {username} exists at {uri}: its password and Secret {namespace}/{MLFLOW_SECRET} are kept "
                  "(--rotate gives it a new password and writes the Secret)", markup=False)
        return
    try:
        cluster.apply_secret(mlflow_credentials_secret(namespace, username, user.password))
    except PipectlError as e:
        done = "created" if user.created else "given a new password"
        fail(f"MLflow user {username} was {done}, but Secret {namespace}/{MLFLOW_SECRET} was not written: {e.headline}",
             f"{e.hint + '; then ' if e.hint else ''}run `pipectl teams mlflow-user {team} --rotate`: it sets a new "
             "password and writes the Secret", code=e.exit_code)
    out.print(f"MLflow user {username} {'created' if user.created else 'given a new password'} at {uri}; "
              f"Secret {namespace}/{MLFLOW_SECRET} written (the team's steps use it from their next run)", markup=False)


@teams.command("store-policy")
@click.option("--apply", "apply_", is_flag=True, default=False,
              help="Write it into each bucket's policy (as the bucket's owner), keeping the statements pipectl does not own.")
@click.option("--s3-endpoint", envvar="PIPECTL_S3_ENDPOINT", default=None,
              help="The store's S3 endpoint as this machine reaches it; credentials from PIPECTL_S3_ACCESS_KEY/PIPECTL_S3_SECRET_KEY.")
def store_policy(apply_: bool, s3_endpoint: str | None) -> None:
    """The bucket policy that holds each team's store key to its own s3_prefix: the key of the
    team's s3_principal may read, write, delete and list there, and nowhere else (the bucket's
    owner keeps every right). Without --apply: printed, one JSON document per bucket, for your own
    tools (aws s3api put-bucket-policy). With --apply: pipectl's statements (Sid pipectl-team-*) in
    each bucket's policy are replaced, every other statement is kept.

    Put each team's key into its namespace's Secret pipectl-s3-credentials (PIPECTL_S3_ACCESS_KEY,
    PIPECTL_S3_SECRET_KEY); its runs keep their datasets, runs and logs under the team's prefix.
    Exit 2: a team without s3_principal, or no teams; 3: the store cannot be reached or refuses
    (not the bucket's owner).

    \b
    Example:
      export PIPECTL_S3_ACCESS_KEY=... PIPECTL_S3_SECRET_KEY=...   # the bucket owner's key
      pipectl --site site.yaml teams store-policy                  # look first
      pipectl --site site.yaml teams store-policy --apply
    """
    from pipectl.pipelines.store_policy import bucket_policies, merged_policy

    cfg = compile_config()
    if not cfg.teams:
        fail("the site file declares no teams:", "declare the teams (and each one's s3_principal) under teams:", code=2)
    try:
        policies = bucket_policies(cfg.teams)
    except ValueError as e:
        fail(str(e), "e.g. s3_principal: arn:aws:iam:::user/pipectl-<team> (the Ceph RGW user of the team's key)", code=2)
    if not apply_:
        for bucket, statements in sorted(policies.items()):
            click.echo(f"# bucket {bucket}")
            click.echo(json.dumps(merged_policy(None, statements), indent=2))
        return
    from pipectl.components.contracts import StoreSettings
    from pipectl.components.runtime import s3_client
    from pipectl.pipelines.backends.store_admin import apply_policies

    settings = StoreSettings(**({"s3_endpoint": s3_endpoint} if s3_endpoint else {}))
    done = apply_policies(s3_client(settings), policies)  # Unreachable: exit 3, naming the bucket
    out = console()
    for a in done:
        out.print(f"bucket {a.bucket}: {a.statements} statements for its teams written, {a.kept} others kept", markup=False)


@teams.command("mlflow-config")
def mlflow_config() -> None:
    """Print the [pipectl] section of the MLflow auth app's config (MLFLOW_AUTH_CONFIG_PATH) for the
    site file's teams: each team's MLflow user (named as the team, `pipectl teams mlflow-user`) may
    create or rename experiments and registered models only under its model prefix. The server
    enforces it with authorization_function = pipectl.pipelines.backends.mlflow_names:authenticate
    (docs/mlflow-basic-auth.ini). Exit 2: the site file declares no teams.

    \b
    Example:
      pipectl --site site.yaml teams mlflow-config   # in place of the config file's [pipectl] section
    """
    from pipectl.pipelines.backends.mlflow_names import render_section

    cfg = compile_config()
    if not cfg.teams:
        fail("the site file declares no teams:", "declare the teams under teams:", code=2)
    click.echo(render_section({t.name: t.model_prefix for t in cfg.teams}), nl=False)
