"""Gang launchers: the one registry. A launcher is a :class:`~.base.Launcher` subclass in a file of
its own plus one line in :data:`LAUNCHERS`; everything else (the CLI's ``--launcher`` choices, the
train step, lint, RBAC, the local backend, retry clean-up) reads it from here.

Light on purpose (PyYAML and the names only, no hera or client library): the CLI imports it to
list its choices.
"""

from __future__ import annotations

from pipectl.pipelines.launchers.base import GangConfig, Launcher, ReplicaGroup
from pipectl.pipelines.launchers.pytorchjob import PyTorchJob
from pipectl.pipelines.launchers.volcano import VolcanoJob

LAUNCHERS: dict[str, Launcher] = {launcher.name: launcher for launcher in (
    VolcanoJob(),
    PyTorchJob(),
)}
"""``--launcher`` value -> launcher; the first is the default."""

DEFAULT_LAUNCHER = next(iter(LAUNCHERS))


def launcher_for(obj: dict) -> Launcher | None:
    """The launcher whose job kind ``obj`` is (None for any other object)."""
    return next((launcher for launcher in LAUNCHERS.values() if launcher.handles(obj)), None)


__all__ = ["DEFAULT_LAUNCHER", "LAUNCHERS", "GangConfig", "Launcher", "ReplicaGroup", "launcher_for"]
