"""`python -m pipectl.components.validate`: argv -> the run's parameters -> exit code (C15).

pipectl's parameters (TrainingParameters) and, with ``--pipeline-parameters SPECS``, the
pipeline's own, each checked by the rules its spec gives (pipeline_parameters.parameter_model)."""

import argparse
import sys

from pipectl.components.contracts import kebab
from pipectl.components.pipeline_parameters import SPECS_INPUT, parameter_model, specs_from_json
from pipectl.components.runtime import step_main
from pipectl.components.validate.core import run

if __name__ == "__main__":
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument(f"--{kebab(SPECS_INPUT)}", dest="specs", default="[]")
    known, rest = pre.parse_known_args()
    sys.exit(step_main(parameter_model(specs_from_json(known.specs)), run, argv=rest, prog="pipectl.components.validate"))
