"""`python -m pipectl.components.train`: argv -> TrainInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import TrainInput
from pipectl.components.runtime import step_main
from pipectl.components.train.core import run

if __name__ == "__main__":
    sys.exit(step_main(TrainInput, run, prog="pipectl.components.train"))
