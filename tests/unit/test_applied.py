"""Which keys of an applied object's spec another applier left (pipectl.pipelines.backends.applied);
the server-side apply itself runs against the API server in tests/cluster/test_cli_conventions.py."""

from __future__ import annotations

from pipectl.pipelines.backends.applied import left_over, pointer, removal_patch

RENDERED = {"spec": {"entrypoint": "training", "ttlStrategy": {"secondsAfterSuccess": 86400}}}


def _live(spec: dict, managed: list[dict]) -> dict:
    return {"metadata": {"resourceVersion": "7", "managedFields": managed}, "spec": spec}


def test_keys_another_apply_left_are_named_and_keys_set_by_an_update_are_not():
    spec = {"entrypoint": "training", "parallelism": 2, "suspend": True,
            "ttlStrategy": {"secondsAfterSuccess": 86400, "secondsAfterCompletion": 600}}
    managed = [
        {"manager": "kubectl", "operation": "Apply",
         "fieldsV1": {"f:spec": {"f:parallelism": {}, "f:ttlStrategy": {"f:secondsAfterCompletion": {}}}}},
        {"manager": "pipectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:entrypoint": {}, "f:ttlStrategy": {}}}},
        {"manager": "pipectl", "operation": "Update", "fieldsV1": {"f:spec": {"f:suspend": {}}}},
    ]
    assert left_over(_live(spec, managed), RENDERED) == [("spec", "parallelism"), ("spec", "ttlStrategy", "secondsAfterCompletion")]


def test_nothing_is_left_when_the_spec_is_the_rendered_one_or_only_pipectl_applied():
    assert left_over(_live(RENDERED["spec"], [{"manager": "kubectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:entrypoint": {}}}}]),
                     RENDERED) == []
    assert left_over(_live({**RENDERED["spec"], "parallelism": 2},
                           [{"manager": "pipectl", "operation": "Apply", "fieldsV1": {"f:spec": {"f:parallelism": {}}}}]), RENDERED) == []


def test_the_removal_patch_is_tied_to_the_version_read_and_escapes_keys():
    assert pointer(("metadata", "annotations", "a/b~c")) == "/metadata/annotations/a~1b~0c"
    assert removal_patch("7", [("spec", "parallelism")]) == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "7"}, {"op": "remove", "path": "/spec/parallelism"}]
