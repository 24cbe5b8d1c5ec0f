"""`python -m pipectl.components.preprocess`: argv -> PreprocessInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import PreprocessInput
from pipectl.components.runtime import step_main
from pipectl.components.preprocess.core import run

if __name__ == "__main__":
    sys.exit(step_main(PreprocessInput, run, prog="pipectl.components.preprocess"))
