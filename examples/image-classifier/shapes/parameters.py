"""The team's own parameters: arguments of its WorkflowTemplate beside pipectl's (typed and
described in the Argo UI, ``-p weight-decay=0.001`` on the CLI, checked by ``validate``)."""

from pydantic import Field

from pipectl.sdk import Parameters


class ShapesParameters(Parameters):
    weight_decay: float = Field(0.0005, ge=0, le=0.1, description="L2 penalty of the SGD optimiser.")
    label_smoothing: float = Field(0.1, ge=0, lt=1, description="Share of each label's probability spread over the other classes.")
    random_flips: bool = Field(True, description="Flip half of each batch horizontally while training.")
