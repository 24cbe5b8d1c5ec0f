"""The end of a run's gang: no run that did not succeed leaves a gang job or a gang pod behind (C19).

Argo ends the train step's launcher pod when a workflow is stopped, times out or fails, but nothing
deletes the gang job it created (its owner, the Workflow, is kept for days after a failure): a hung
gang would keep its GPUs, a gang still Pending could be scheduled later. One rule
(:func:`core.release`: delete every gang job of the run, wait until their pods are gone), three
callers: the ``gang-release`` exit handler (:mod:`.step`), ``pipectl terminate`` / ``retry``, and
the gang reaper (:mod:`.reaper`), which watches the namespace's workflows and covers the endings
that run no exit handler (TERMINATE in the Argo UI, ``argo terminate``).
"""
