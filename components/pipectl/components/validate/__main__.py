"""`python -m pipectl.components.validate`: argv -> TrainingParameters -> exit code (C15)."""

import sys

from pipectl.components.contracts import TrainingParameters
from pipectl.components.runtime import step_main
from pipectl.components.validate.core import run

if __name__ == "__main__":
    sys.exit(step_main(TrainingParameters, run, prog="pipectl.components.validate"))
