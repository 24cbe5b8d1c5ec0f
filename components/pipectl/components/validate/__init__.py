"""The ``validate`` step: the workflow's parameters checked inside the cluster before anything runs.

Argo substitutes parameters as text and neither the Argo UI nor the Argo Server API enforces
types or enums (field case C15), so a value submitted there can carry a newline and YAML into
the gang job's manifest. This step runs first and parses every workflow parameter with the same
contract the CLI uses (:class:`~pipectl.components.contracts.TrainingParameters`); a bad value
exits 1 (not retried) with a message naming the parameter, and no later step starts.
"""
