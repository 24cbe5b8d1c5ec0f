"""The codebase's shape, checked over the source so it cannot quietly erode:
layers import only what docs/architecture.md ("Layers") allows, there are no import cycles, a launcher is known in one
place, the train step's arguments are its contracts, and the store layout has one definition."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROOTS = ("cli", "pipelines", "components")
"""The design's top-level folders, each a root of the ``pipectl`` namespace: <root>/pipectl/<root>/."""

# The compile layer (pipelines/ less backends/) may not import these at all: no client library,
# no process, no network (docs/architecture.md, "Layers"). Steps (components/) never import hera, click or pipelines.
IO_MODULES = {"kubernetes", "boto3", "botocore", "mlflow", "requests", "urllib3", "subprocess", "socket", "psutil",
              "moto", "torch", "nvidia", "urllib.request"}
STEP_FORBIDDEN = {"hera", "click", "pipectl.pipelines", "pipectl.cli"}


def _modules() -> dict[str, Path]:
    """Import name -> file: the path under its root, nothing else (what a tool that does not
    install the package sees)."""
    out = {}
    for folder in ROOTS:
        for path in (ROOT / folder).rglob("*.py"):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            out[".".join(p for p in rel.parts if p != "__init__")] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    names: set[str] = set()
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                base = ".".join(parent + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


MODULES = _modules()
IMPORTS = {m: _imports(p, m) for m, p in MODULES.items()}


def _internal(names: set[str]) -> set[str]:
    return {n for n in names if n in MODULES}


def _top(name: str) -> set[str]:
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


PUBLIC_API = {"pipectl.sdk": "pipelines"}
"""The public API users import, and the root it lives under (it re-exports the compile layer)."""


def test_every_module_lives_where_its_import_name_says():
    """The layout (pyproject.toml): <root>/pipectl/<root>/..., so the import name is the path; the
    public API (``pipectl.sdk``) is the one module under a root that is not named after it."""
    assert all(m.startswith(f"pipectl.{p.relative_to(ROOT).parts[0]}") or PUBLIC_API.get(m) == p.relative_to(ROOT).parts[0]
               for m, p in MODULES.items()), MODULES
    assert {"pipectl.cli.main", "pipectl.pipelines.training", "pipectl.components.contracts"} <= set(MODULES)


def test_modules_import_from_the_checkout_without_installing():
    """An isolated interpreter (no site-packages, no .pth, no environment) with only the three roots
    on its path imports pipectl's modules from this checkout, as an editor or type checker would."""
    import subprocess
    import sys

    roots = [str(ROOT / r) for r in ROOTS]
    code = ("import sys; sys.path[:0] = %r\n"
            "import pipectl.components.names, pipectl.pipelines.substitution, pipectl.pipelines.security, pipectl.cli\n"
            "print(pipectl.components.names.__file__); print(pipectl.pipelines.security.__file__); print(list(pipectl.__path__))" % roots)
    r = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    names, security, namespace = r.stdout.splitlines()
    assert names == str(ROOT / "components/pipectl/components/names.py")
    assert security == str(ROOT / "pipelines/pipectl/pipelines/security.py")
    assert sorted(eval(namespace)) == sorted(str(ROOT / r / "pipectl") for r in ROOTS)  # one namespace, three roots


def test_the_compile_layer_does_no_io():
    compile_layer = [m for m in MODULES if m.startswith(("pipectl.pipelines", "pipectl.sdk"))
                     and not m.startswith("pipectl.pipelines.backends")]
    assert "pipectl.pipelines.training" in compile_layer and "pipectl.pipelines.launchers.volcano" in compile_layer
    bad = {m: sorted(n for n in IMPORTS[m] if _top(n) & IO_MODULES or n.startswith("pipectl.pipelines.backends"))
           for m in compile_layer}
    assert {m: b for m, b in bad.items() if b} == {}


STEPS_EXTRA_MODULES = ("torch", "mlflow", "nvidia", "boto3", "botocore", "moto", "psutil", "numpy", "PIL", "sklearn")
"""Top-level modules of pyproject's `steps` extra: the light install has none of them."""


@pytest.mark.parametrize("argv", [["--help"], ["render", "training"], ["submit", "training", "--dry-run", "-p", "epochs=2"],
                                  ["lint", "argo/namespace/workflowtemplates"], ["completion", "bash"]])
def test_the_light_commands_import_none_of_the_steps_extra(argv):
    """What `pip install pipectl` (no extra) must run: importing the CLI and running these commands
    in an isolated interpreter loads none of the `steps` extra's modules (heavy imports stay inside
    `pipectl run` and the steps). tests/integration/test_light_install.py installs it for real."""
    import subprocess
    import sys

    from pipectl.cli.common import STEPS_MODULES

    assert STEPS_MODULES == set(STEPS_EXTRA_MODULES)
    code = ("import sys; sys.path[:0] = %r; sys.argv = ['pipectl'] + %r\n"
            "from pipectl.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & %r), file=sys.stderr)"
            % ([str(ROOT / r) for r in ROOTS], argv, set(STEPS_EXTRA_MODULES)))
    r = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={"KUBECONFIG": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == "[]", r.stderr[-2000:]


def test_the_step_images_pin_the_steps_extra_and_the_cli_dependencies_they_use():
    """The images install exact pins (images/requirements-*.txt) and the project with --no-deps: every
    requirement of the `steps` extra (but moto, the embedded S3 of `pipectl run`) and of the CLI
    the steps use is pinned there, at a version pyproject allows."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = {}
    for f in sorted((ROOT / "images").glob("requirements-*.txt")):
        for line in f.read_text().splitlines():
            if line.split("#")[0].strip():
                req = Requirement(line.split("#")[0].strip())
                pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    wanted = [Requirement(r) for r in project["optional-dependencies"]["steps"] + project["dependencies"]]
    not_in_images = {"moto", "jsonschema", "requests"}  # moto: not on a cluster; lint and the Argo Server API: CLI only
    missing = [str(r) for r in wanted if canonicalize_name(r.name) not in pins and r.name not in not_in_images]
    assert missing == [], f"pin these in images/requirements-*.txt: {missing}"
    off = [f"{r} (image pins {pins[canonicalize_name(r.name)]})" for r in wanted
           if canonicalize_name(r.name) in pins and pins[canonicalize_name(r.name)] not in r.specifier]
    assert off == []
    assert "moto" not in pins and {"torch", "mlflow", "nvidia-dali-cuda120"} <= set(pins)


def test_steps_import_no_pipeline_or_cli_code():
    steps = [m for m in MODULES if m.startswith("pipectl.components")]
    bad = {m: sorted(n for n in IMPORTS[m] if _top(n) & STEP_FORBIDDEN) for m in steps}
    assert {m: b for m, b in bad.items() if b} == {}


def test_no_import_cycles():
    graph = {m: _internal(IMPORTS[m]) - {m} for m in MODULES}
    # a package's __init__ re-exporting its own submodules is not a cycle through them
    for m in graph:
        graph[m] = {n for n in graph[m] if not (n.startswith(m + ".") or m.startswith(n + "."))}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_checker_sees_a_cycle_and_an_io_import(tmp_path):
    """The checks above can fail: the same functions on a made-up pair of modules that import each other."""
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("import subprocess\nfrom pipectl.pipelines import b\n")
    b.write_text("def f():\n    from pipectl.pipelines import a\n")
    ia, ib = _imports(a, "pipectl.pipelines.a"), _imports(b, "pipectl.pipelines.b")
    assert "pipectl.pipelines.b" in ia and "pipectl.pipelines.a" in ib and "subprocess" in ia


def test_a_launcher_is_named_in_one_place():
    """Outside pipelines/pipectl/pipelines/launchers/, no product module spells a launcher's name, kind or API group."""
    from pipectl.pipelines.launchers import LAUNCHERS

    words = {w for launcher in LAUNCHERS.values() for w in (f'"{launcher.name}"', f'"{launcher.kind}"', launcher.api_version)}
    words.discard('"Job"')  # also a batch/v1 kind; checked through api_version
    found = {m: sorted(w for w in words if w in MODULES[m].read_text())
             for m in MODULES if not m.startswith("pipectl.pipelines.launchers")}
    assert {m: f for m, f in found.items() if f} == {}


def test_the_train_step_inputs_are_its_contracts():
    """TrainInput's and GangShape's fields, and the gang affinity the ``gang-avoid`` step writes."""
    from pipectl.components.contracts import GangShape, TrainInput
    from pipectl.pipelines.launchers.base import GANG_AFFINITY_INPUT, TRAIN_FIXED, TRAIN_PER_PIPELINE
    from pipectl.pipelines.builtin import build_training

    template = build_training().to_dict()
    train = next(t for t in template["spec"]["templates"] if t["name"] == "train")
    inputs = [p["name"] for p in train["inputs"]["parameters"]]
    expected = ([n for n in TrainInput.model_fields if n not in TRAIN_FIXED and n not in TRAIN_PER_PIPELINE]
                + list(GangShape.model_fields))
    assert inputs == [n.replace("_", "-") for n in expected] + [GANG_AFFINITY_INPUT]


@pytest.mark.parametrize("launcher", ["volcano", "pytorchjob"])
def test_every_gang_pod_command_parses_as_TrainInput(launcher):
    """The gang pod's ``-m pipectl.components.train`` arguments, substituted with the defaults, are
    exactly a valid TrainInput (the train component's own parser reads them)."""
    import yaml

    from pipectl.components.contracts import TrainInput, TrainingParameters
    from pipectl.components.runtime import build_parser
    from pipectl.pipelines.launchers import LAUNCHERS
    from pipectl.pipelines.substitution import substitute
    from pipectl.pipelines.training import CompileConfig

    lau = LAUNCHERS[launcher]
    values = {f"inputs.parameters.{k}": v for k, v in TrainingParameters().as_arguments().items()}
    values |= {"inputs.parameters.shards-uri": "s3://b/runs/w/shards/", "inputs.parameters.run-uri": "s3://b/runs/w",
               "workflow.name": "w", "retries": "0", "inputs.parameters.gang-affinity": "{}"}
    for function in ("", "mypkg.train:train"):
        job = yaml.safe_load(substitute(lau.manifest(CompileConfig(launcher=launcher).gang(function=function)), values, where="test"))
        for group in lau.replica_groups(job):
            command = group.pod_spec["containers"][0]["command"]
            args = command[command.index("pipectl.components.train") + 1:]
            parsed = {k: v for k, v in vars(build_parser(TrainInput, "train").parse_args(args)).items() if v is not None}
            parsed.pop("outputs_dir")  # as step_main reads it: an option not given keeps the field's default
            inp = TrainInput.model_validate(parsed)
            assert (inp.workflow_name, inp.function) == ("w", function)


def _code_strings(path: Path) -> list[str]:
    """String constants of a module's code (docstrings left out: they may describe the layout)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings]


def test_store_layout_has_one_definition():
    """No step or template spells a run's or dataset's object names: they come from RunLayout /
    DatasetLayout in the contracts (the local runner's own work folder is not the store)."""
    names = ("train-output.json", "evaluate-output.json", "checkpoints/", "/checkpoints", "latest.json", "manifest.json", "/data/", "/runs/")
    scanned = [m for m in MODULES if m != "pipectl.components.contracts" and not m.startswith("pipectl.pipelines.backends")]
    # (a URL fragment such as MLflow's UI route #/runs/<id>, the Argo UI's link, is no store path)
    found = {m: sorted({w for text in _code_strings(MODULES[m]) if "/#/" not in text for w in names if w in text}) for m in scanned}
    assert {m: f for m, f in found.items() if f} == {}


def test_layouts():
    from pipectl.components.contracts import DatasetLayout, RunLayout

    run = RunLayout.for_workflow("b", "wf-1")
    assert (run.shards_uri, run.checkpoint_uri(40), run.latest_checkpoint_uri, run.train_output_uri, run.evaluate_output_uri) == (
        "s3://b/runs/wf-1/shards/", "s3://b/runs/wf-1/checkpoints/step-00000040.pt", "s3://b/runs/wf-1/checkpoints/latest.json",
        "s3://b/runs/wf-1/train-output.json", "s3://b/runs/wf-1/evaluate-output.json")
    ds = DatasetLayout.of_manifest("s3://b/datasets/0123/manifest.json")
    assert (ds.dataset_uri, ds.data_uri, ds.manifest_uri) == ("s3://b/datasets/0123/", "s3://b/datasets/0123/data/", "s3://b/datasets/0123/manifest.json")
    assert DatasetLayout.prefix_for("ab" * 32) == "datasets/" + ("ab" * 32)[:20]
    with pytest.raises(ValueError, match="is not a dataset's manifest.json"):
        DatasetLayout.of_manifest("s3://b/datasets/0123/index.json")


def test_pyproject_lists_every_package():
    """A subpackage missing from pyproject's list would be missing from the wheel and the images."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {m for m, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == packages


def test_test_files_collected_in_one_process_have_distinct_names():
    """Tier 1 and 1b collect tests/ but tests/cluster in one pytest process each; the test folders
    are not packages (rootdir-relative imports), so two files of one name there stop collection
    ("import file mismatch") and the whole tier runs nothing."""
    from collections import defaultdict

    seen: dict[str, list[str]] = defaultdict(list)
    for path in (ROOT / "tests").rglob("test_*.py"):
        rel = path.relative_to(ROOT / "tests")
        if rel.parts[0] not in ("cluster", "bench"):
            seen[path.name].append(str(rel))
    assert not {name: where for name, where in seen.items() if len(where) > 1}
