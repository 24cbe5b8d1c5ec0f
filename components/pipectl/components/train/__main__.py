"""`python -m pipectl.components.train`: argv -> TrainInput -> run() -> outputs + exit code."""

from pipectl.components.contracts import TrainInput
from pipectl.components.runtime import step_main
from pipectl.components.train.core import run
from pipectl.components.train.process_end import end_process

if __name__ == "__main__":
    end_process(step_main(TrainInput, run, prog="pipectl.components.train"))
