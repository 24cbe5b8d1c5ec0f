"""`python -m pipectl.components.prebuilt`: argv -> PrebuiltInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import PrebuiltInput
from pipectl.components.prebuilt.core import run
from pipectl.components.runtime import step_main

if __name__ == "__main__":
    sys.exit(step_main(PrebuiltInput, run, prog="pipectl.components.prebuilt"))
