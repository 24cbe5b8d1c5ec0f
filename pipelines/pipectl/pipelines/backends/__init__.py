"""Backends: what consumes the compile layer's output with I/O — processes, services, APIs.

- :mod:`.local` — ``pipectl run``: checks, embedded services, then the runner;
- :mod:`.runner` — executes a compiled WorkflowTemplate on this machine, pods as processes;
- :mod:`.services` — the embedded S3 and MLflow servers;
- :mod:`.processes` — the one process supervisor (also used by the test harness);
- :mod:`.kube` — the Kubernetes API and the Argo Server.
"""
