"""Which failures inside the training processes are the infrastructure's, read from what torch records.

The gang's retry rules tell infrastructure from code by the container's exit code
(:mod:`pipectl.components.train.launch`: 1 is the code's fault and ends the run, 75 restarts the
gang within the infrastructure budget). Some failures surface as a Python exception in a worker, or
in torchrun's own agent, although nothing in the code is wrong. Their class is decided here, from
the exception torch records — the agent's exception type, or the worker's error file that
torchelastic's ``@record`` (and pipectl's ``step_main``) write as ``"<Type>: <message>"`` — never
from the log's text:

=====================  ==============  ====================================================================
fault                  class           why
=====================  ==============  ====================================================================
rendezvous             infrastructure  a peer pod that starts late (image pull on a fresh node, scale-up)
                                       or never: the agents' store times out before any worker ran (C20)
gpu-hardware           infrastructure  an uncorrectable ECC error, a GPU fallen off the bus or lost (C21):
                                       the node's hardware; the node is named in the pod's message
collective-timeout     infrastructure  an NCCL watchdog or gloo transfer timeout, a peer's connection
                                       reset: a member of the gang died or its network did. A code
                                       deadlock (a rank skipping a collective) looks the same and is
                                       retried too, up to ``infra_limit`` gang restarts
(anything else)        code            exit 1: a ``ValueError``, a ``KeyError``, a CUDA error the code
                                       caused (an illegal memory access, out of memory) ...
=====================  ==============  ====================================================================

A worker whose code does not record its exception (no ``@record`` on the user's ``main``) leaves
no error file: its failure is the code's (exit 1), as before.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Fault:
    """A kind of failure the infrastructure causes, recognised by the recorded exception."""

    name: str
    pattern: re.Pattern[str]
    hint: str


INFRASTRUCTURE_FAULTS = (
    Fault("rendezvous", re.compile(r"^(DistStoreError|DistNetworkError|Rendezvous\w*Error)\b"),
          "a gang member did not join in time (a late or lost pod): the gang restarts"),
    Fault("gpu-hardware", re.compile(r"ECC error|fallen off the bus|GPU is lost|GPU_IS_LOST|unrecoverable hardware error",
                                     re.IGNORECASE),
          "a GPU hardware fault on this node: the gang restarts; drain the node if it repeats"),
    Fault("collective-timeout", re.compile(r"Watchdog caught collective operation timeout|"
                                           r"Timed out waiting \d+ms for (recv|send) operation|"
                                           r"Connection (reset|closed) by peer|NCCL communicator was aborted"),
          "a collective did not complete (a peer or its network failed): the gang restarts"),
)


def classify(recorded: str) -> Fault | None:
    """The infrastructure fault ``recorded`` (``"<ExceptionType>: <message>"``) shows, or None
    for a failure of the code."""
    first = recorded.strip()
    for fault in INFRASTRUCTURE_FAULTS:
        if fault.pattern.search(first):
            return fault
    return None


def recorded_message(error_file_data: dict) -> str:
    """The ``"<Type>: <message>"`` of a torchelastic error file's data ("" when there is none)."""
    message = error_file_data.get("message", "")
    if isinstance(message, dict):
        message = message.get("message", "")
    return str(message or "")
