"""`python -m pipectl.components.stage`: argv -> StageInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import StageInput
from pipectl.components.runtime import step_main
from pipectl.components.stage.core import run

if __name__ == "__main__":
    sys.exit(step_main(StageInput, run, prog="pipectl.components.stage"))
