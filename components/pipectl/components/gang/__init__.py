"""The ``gang-release`` step: a run that did not succeed leaves no gang job and no gang pod behind (C19).

Argo ends the train step's launcher pod when a workflow is stopped, times out or fails, but nothing
deletes the gang job it created (its owner, the Workflow, is kept for days after a failure): a hung
gang would keep its GPUs, a gang still Pending could be scheduled later. This exit handler deletes
every gang job of the run and waits until their pods are gone (:func:`core.release`).
"""
