"""`python -m pipectl.components.register`: argv -> RegisterInput -> run() -> outputs + exit code."""

import sys

from pipectl.components.contracts import RegisterInput
from pipectl.components.runtime import step_main
from pipectl.components.register.core import run

if __name__ == "__main__":
    sys.exit(step_main(RegisterInput, run, prog="pipectl.components.register"))
