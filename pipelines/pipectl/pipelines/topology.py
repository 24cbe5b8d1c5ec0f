"""The gang's placement: its pods in one network domain (a rack, a block, a switch), set once per site.

A data-parallel gang all-reduces its gradients at every step; the fewer switch hops between its
pods, the less of the step waits for that sync (the step anatomy's ``sync`` share). Where the
cluster labels its nodes with their place in the network, the site file's ``topology`` key gives
every gang pod a pod affinity to the run's other gang pods on that label::

    # site.yaml
    topology:
      key: topology.k8s.aws/network-node-layer-3   # the node label naming a node's network domain
      mode: preferred                              # or required

Labels clouds set: AWS ``topology.k8s.aws/network-node-layer-1`` … ``-3`` (layer 3 nearest the
node), GKE ``cloud.google.com/gce-topology-block`` / ``-subblock``, any cluster
``topology.kubernetes.io/zone``; on your own hardware, a rack label of your own.

``preferred`` (weight 100, the most the API allows): the scheduler puts the gang in one domain
when one has room and spreads it otherwise. ``required``: the gang waits (Pending, up to the
attempt's timeout) until one domain can hold all of it; choose it only where a gang split across
domains is not worth running.

How it reaches the pods: the train step's ``gang-affinity`` input starts as this affinity, with the
run's name in its label selector (Argo resolves ``{{workflow.name}}`` in an input's default before
the template's other tags); after the gang preflight named slow nodes, ``gang-avoid`` keeps it and
adds its node anti-affinity (:mod:`pipectl.components.gang.avoid`). ``pipectl lint`` checks the
result against the gang job's vendored schema. Volcano's network-topology scheduling (HyperNodes,
a Job's ``networkTopology``) is not used: the Volcano Job schema pipectl renders for (1.10) has no
such field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_LABEL_KEY = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
"""A Kubernetes label key: an optional DNS-subdomain prefix and ``/``, then a name of at most 63 characters."""
HOSTNAME_KEY = "kubernetes.io/hostname"
WEIGHT = 100
"""The preferred term's weight: the most the API allows, so it outweighs the scheduler's spreading scores."""


class Topology(BaseModel):
    """Where the gang's pods go relative to each other: nodes sharing one value of ``key``."""

    model_config = ConfigDict(extra="forbid")

    key: str = Field(pattern=_LABEL_KEY, max_length=317, description="The node label naming a node's network domain "
                     "(its rack, block or switch), e.g. topology.k8s.aws/network-node-layer-3.")
    mode: Literal["preferred", "required"] = Field("preferred", description="preferred: one domain when one has "
                                                   "room; required: the gang waits until one domain can hold all of it.")

    @model_validator(mode="after")
    def _not_one_node(self) -> "Topology":
        if self.key == HOSTNAME_KEY:
            raise ValueError(f"topology.key {HOSTNAME_KEY} would put every gang pod on one node: run more processes per "
                             "worker instead (processes-per-worker), or name a label of the network's racks or blocks")
        prefix = self.key.rsplit("/", 1)[0] if "/" in self.key else ""
        if len(prefix) > 253:
            raise ValueError(f"topology.key: the prefix {prefix[:40]!r}… is longer than 253 characters")
        return self

    def affinity(self, gang_labels: dict[str, str]) -> dict:
        """The gang pods' ``affinity`` (Kubernetes Affinity): a pod affinity on :attr:`key` to
        the pods matching ``gang_labels`` (the run's gang pods, Argo tags allowed in the values)."""
        term = {"labelSelector": {"matchLabels": dict(gang_labels)}, "topologyKey": self.key}
        if self.mode == "required":
            return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
        return {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": WEIGHT, "podAffinityTerm": term}]}}

