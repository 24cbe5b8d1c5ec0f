"""Test harness: the real services the test suite starts by itself.

    binaries.py      versions of the test cluster's upstream binaries, their cache, Go module CRDs
    pki.py           the cluster's CA, serving and client certificates, kubeconfig
    kwok.py          fake nodes and pod lifecycles (KWOK), from manifests/*.yaml
    controlplane.py  TestCluster: etcd, kube-apiserver, controllers, KWOK, Argo, Volcano
    argoexec.py      the argoexec stand-in (WorkflowTaskResults, resource templates)
    components.py    named processes of a fixture, on pipectl.pipelines.backends.processes
    cli.py           `tests/cluster/cluster.py up|down|check`
    manifests/       KWOK Stages, KWOK config, the fake Node, Argo's controller ConfigMap

The real node (tests/cluster/node.py), Ceph (tests/ceph/ceph.py) and Alluxio
(tests/alluxio/alluxio.py) start their processes through components.py as well: one process
supervisor, the product's :mod:`pipectl.pipelines.backends.processes`.
"""
