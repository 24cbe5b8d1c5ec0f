"""`python -m pipectl.components.gang`: argv -> ReleaseInput -> every gang job of the run deleted -> exit code.

`python -m pipectl.components.gang reap ...`: the gang reaper, a long-running process (:mod:`.reaper`)."""

import sys

from pipectl.components.contracts import ReleaseInput
from pipectl.components.gang.step import run
from pipectl.components.runtime import step_main

if __name__ == "__main__":
    if sys.argv[1:2] == ["reap"]:
        from pipectl.components.gang.reaper import main

        sys.exit(main(sys.argv[2:]))
    sys.exit(step_main(ReleaseInput, run, prog="pipectl.components.gang"))
