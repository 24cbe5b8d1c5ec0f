"""The gang's fabric profile: how its collectives reach each other, set once per site.

NCCL reads its network settings from environment variables; a value set by hand in one pod spec
and forgotten in the next is how a gang ends up on the management network at a tenth of its
bandwidth. The site file's ``fabric`` key holds them as typed settings, checked when ``argo/`` is
rendered, and every gang pod gets the same environment::

    # site.yaml
    fabric:
      nccl_socket_ifname: "=eth1"      # NCCL's bootstrap and socket traffic on eth1 only
      nccl_ib_hca: "mlx5_0,mlx5_1"     # the InfiniBand/RoCE adapters to use
      nccl_ib_gid_index: 3             # RoCE v2 on most RoCE fabrics
      rdma:
        resource: rdma/rdma_shared_device_a
        count: 1

Meanings (NCCL's environment variables, docs.nvidia.com/deeplearning/nccl "Environment
Variables"): ``NCCL_SOCKET_IFNAME`` a comma list of interface name prefixes, ``^`` in front
excludes them, ``=`` matches names exactly; ``NCCL_IB_HCA`` the same syntax over adapter names
(``mlx5_0:1`` for one port); ``NCCL_IB_DISABLE=1`` sends everything over sockets;
``NCCL_IB_GID_INDEX`` the RoCE GID; ``NCCL_DEBUG`` NCCL's log level. A CPU gang (gloo) gets
``GLOO_SOCKET_IFNAME`` when ``nccl_socket_ifname`` names one interface.

RDMA: the gang pods request ``rdma.count`` of the device plugin's ``rdma.resource`` per pod. Most
RDMA stacks also pin memory, which needs an unlimited memlock limit: give it to containers in
the node's runtime (containerd's ``LimitMEMLOCK=infinity``, as the accelerated node images of the
large clouds do). The other way, the ``IPC_LOCK`` capability, is refused: pipectl's namespaces
enforce Pod Security "restricted", which allows no capability but ``NET_BIND_SERVICE``.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_NAME_LIST = r"^[\^=]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$"
_RESOURCE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
_NATIVE_RESOURCES = {"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu"}


class RdmaSpec(BaseModel):
    """RDMA devices for each gang pod, from the cluster's RDMA device plugin."""

    model_config = ConfigDict(extra="forbid")

    resource: str = Field(pattern=_RESOURCE, description="The device plugin's extended resource name, "
                          "e.g. rdma/rdma_shared_device_a or vpc.amazonaws.com/efa.")
    count: int = Field(1, ge=1, le=64, description="Devices each gang pod requests.")
    ipc_lock: bool = Field(False, description="Add the IPC_LOCK capability to the gang container. Refused: "
                           "pipectl's namespaces enforce Pod Security restricted; give containers an unlimited "
                           "memlock limit in the node's runtime instead.")

    @model_validator(mode="after")
    def _allowed(self) -> "RdmaSpec":
        if self.resource in _NATIVE_RESOURCES or "/" not in self.resource:
            raise ValueError(f"rdma.resource {self.resource!r} is not a device plugin's extended resource: "
                             "write the plugin's name, e.g. rdma/rdma_shared_device_a")
        if self.ipc_lock:
            raise ValueError("rdma.ipc_lock: the IPC_LOCK capability is refused by Pod Security 'restricted', which "
                             "pipectl's namespaces enforce (argo/cluster/namespace.yaml). Give containers an unlimited "
                             "memlock limit in the node's container runtime instead (containerd: LimitMEMLOCK=infinity) "
                             "and leave ipc_lock false")
        return self


class FabricProfile(BaseModel):
    """Network settings of the gang's collectives (NCCL, gloo), rendered into every gang pod."""

    model_config = ConfigDict(extra="forbid")

    nccl_socket_ifname: str | None = Field(None, pattern=_NAME_LIST, description="NCCL_SOCKET_IFNAME: interface "
                                           "name prefixes for NCCL's sockets (^ excludes, = matches exactly), e.g. =eth1.")
    nccl_ib_hca: str | None = Field(None, pattern=_NAME_LIST, description="NCCL_IB_HCA: the InfiniBand/RoCE "
                                    "adapters to use, e.g. mlx5_0,mlx5_1 (mlx5_0:1 for one port).")
    nccl_ib_disable: bool | None = Field(None, description="NCCL_IB_DISABLE: true sends every collective over "
                                         "sockets (no InfiniBand/RoCE).")
    nccl_ib_gid_index: int | None = Field(None, ge=0, le=255, description="NCCL_IB_GID_INDEX: the RoCE GID "
                                          "index (3 is RoCE v2 on most fabrics).")
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = Field(
        None, description="NCCL_DEBUG: NCCL's log level in the gang's logs (INFO names the transport each link uses).")
    rdma: RdmaSpec | None = Field(None, description="RDMA devices each gang pod requests from the cluster's device plugin.")

    @model_validator(mode="after")
    def _consistent(self) -> "FabricProfile":
        if self.nccl_ib_disable and (self.rdma or self.nccl_ib_hca or self.nccl_ib_gid_index is not None):
            raise ValueError("nccl_ib_disable: true turns InfiniBand/RoCE off, yet rdma, nccl_ib_hca or "
                             "nccl_ib_gid_index is set for it: drop one or the other")
        return self

    def env(self) -> list[dict]:
        """The gang container's environment entries (Kubernetes ``env`` items), in a fixed order."""
        ib_disable = self.nccl_ib_disable if self.nccl_ib_disable is not None else (False if self.rdma else None)
        values = {
            "NCCL_SOCKET_IFNAME": self.nccl_socket_ifname,
            "GLOO_SOCKET_IFNAME": _single_interface(self.nccl_socket_ifname),
            "NCCL_IB_HCA": self.nccl_ib_hca,
            "NCCL_IB_DISABLE": None if ib_disable is None else str(int(ib_disable)),
            "NCCL_IB_GID_INDEX": None if self.nccl_ib_gid_index is None else str(self.nccl_ib_gid_index),
            "NCCL_DEBUG": self.nccl_debug,
        }
        return [{"name": k, "value": v} for k, v in values.items() if v is not None]

    def limits(self) -> dict[str, int]:
        """Extended resources each gang pod requests (limits; Kubernetes sets requests equal)."""
        return {self.rdma.resource: self.rdma.count} if self.rdma else {}


def _single_interface(ifname: str | None) -> str | None:
    """gloo takes one interface name, not NCCL's list syntax: ``eth1`` or ``=eth1`` → ``eth1``."""
    if ifname is None:
        return None
    m = re.fullmatch(r"=?([A-Za-z0-9_.:-]+)", ifname)
    return m.group(1) if m else None
