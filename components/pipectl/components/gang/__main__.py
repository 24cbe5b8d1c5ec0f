"""`python -m pipectl.components.gang`: argv -> ReleaseInput -> every gang job of the run deleted -> exit code."""

import sys

from pipectl.components.contracts import ReleaseInput
from pipectl.components.gang.step import run
from pipectl.components.runtime import step_main

if __name__ == "__main__":
    sys.exit(step_main(ReleaseInput, run, prog="pipectl.components.gang"))
