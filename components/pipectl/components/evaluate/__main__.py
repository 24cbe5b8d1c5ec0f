"""`python -m pipectl.components.evaluate`: argv -> EvaluateInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import EvaluateInput
from pipectl.components.runtime import step_main
from pipectl.components.evaluate.core import run

if __name__ == "__main__":
    sys.exit(step_main(EvaluateInput, run, prog="pipectl.components.evaluate"))
