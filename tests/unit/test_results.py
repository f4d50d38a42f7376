"""ci.core.results: what a results file must hold, and the file named in every refusal."""

from __future__ import annotations

import json

import pytest

from ci.core import stats
from ci.core.errors import DataError
from ci.core.results import load_results
from tests.unit.factories import make_results, saved

V = stats.Verdict


# ci.core.results: what a results file must hold, and the file named in every refusal --------------


def _payload(**changes):
    payload = make_results({"a": 1.0}).to_json()
    payload.update(changes)
    return payload


def _load(tmp_path, payload):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(payload))
    return path, load_results(path)


def test_optional_fields_default_and_gpu_key(tmp_path):
    payload = _payload(provenance={})
    for field in ("info", "extra"):
        del payload["cases"][0][field]
    _, r = _load(tmp_path, payload)
    assert r.cases[0].info == {} and r.cases[0].extra == {} and r.gpu_key() == ("unknown", 0)
    _, r = _load(tmp_path, _payload(provenance={"gpu": {"driver": "1"}}))
    assert r.gpu_key() == ("unknown", 0)
    _, r = _load(tmp_path, _payload(provenance={"gpu": {"gpus": [{"name": "X"}, {"name": "X"}]}}))
    assert r.gpu_key() == ("X", 2)
    _, r = _load(tmp_path, _payload())
    assert r.cases[0].samples["base"][0] > 1 and min(_payload()["cases"][0]["samples"]["base"]) > 0
    small = _payload()
    small["cases"][0]["samples"]["base"] = [0.25] * 50  # times below 1 are times
    assert _load(tmp_path, small)[1].cases[0].samples["base"][0] == 0.25


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda p: p["cases"][0]["samples"]["base"].__setitem__(0, 0.0),
            "case 'a', build 'base': samples must be positive",
        ),
        (lambda p: p["cases"][0].update(samples={}), "case 'a' has no samples"),
        (lambda p: p["cases"][0].update(samples=[1.0]), "case 'a' has no samples"),
        (lambda p: p["cases"][0].update(extra=3), "case 'a': field 'extra' should be an object, found 3"),
        (lambda p: p["cases"][0].update(info="x"), "case 'a': field 'info' should be an object, found 'x'"),
        (lambda p: p["cases"][0].pop("unit"), "missing field 'unit'"),
        (lambda p: p["cases"][0].pop("id"), "missing field 'id'"),
        (lambda p: p["cases"].append(7), "each case must be an object, found 7"),
        (lambda p: p.pop("cases"), "missing field 'cases'"),
        (lambda p: p.pop("suite"), "missing field 'suite'"),
        (lambda p: p.update(settings=[]), "field 'settings' should be"),
        (lambda p: p.update(provenance=1), "field 'provenance' should be"),
        (lambda p: p["provenance"].update(gpu=["H200"]), "provenance.gpu should be an object"),
        (lambda p: p["provenance"]["gpu"].update(gpus={"name": "x"}), "provenance.gpu.gpus should be a list"),
        (lambda p: p["provenance"]["gpu"].update(gpus=[{"index": 0}]), "objects with a 'name'"),
        (lambda p: p["provenance"]["gpu"].update(gpus=["H200"]), "objects with a 'name'"),
    ],
)
def test_each_refusal_names_the_file_and_the_field(tmp_path, edit, message):
    payload = _payload()
    edit(payload)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError) as err:
        load_results(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


def test_a_file_of_another_kind_is_not_results(tmp_path):
    path = tmp_path / "v.json"
    path.write_text(json.dumps({"kind": "gate-verdict", "schema_version": 1}))
    with pytest.raises(DataError) as err:
        load_results(path)
    from ci.core import subjects  # the kinds subjects registered (here also the tests' own)

    assert str(err.value) == f"{path}: not a results file (kind 'gate-verdict', should be one of {subjects.kinds()})"
    assert {"kernel-bench", "tpot-bench"} <= set(subjects.kinds())
    with pytest.raises(DataError, match="expected a 'tpot-bench' file"):
        load_results(saved(make_results({"a": 1.0}), tmp_path / "k.json"), kind="tpot-bench")


def test_a_version_1_file_is_read_with_its_blocks_as_captures(tmp_path):
    """Version 1 called a sample's capture its block; such a file (every committed run before version 2) is
    read as version 2, and a version the gate does not know is refused."""
    results = make_results({"a": 1.0}, n=4)
    payload = results.to_json()
    payload["schema_version"] = 1
    payload["settings"].update({"blocks": 2, "rounds_per_block": 2})
    payload["cases"][0]["extra"]["blocks"] = {"base": [0, 0, 1, 1], "candidate": [0, 0, 1, 1]}
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(payload))
    old = load_results(path)
    assert old.schema_version == 2 and "blocks" not in old.cases[0].extra
    assert old.cases[0].extra["captures"] == {"base": [0, 0, 1, 1], "candidate": [0, 0, 1, 1]}
    assert old.settings["captures"] == 2 and old.settings["rounds_per_capture"] == 2 and "blocks" not in old.settings
    payload["schema_version"] = 2  # a version-2 file keeps what it says
    path.write_text(json.dumps(payload))
    assert load_results(path).cases[0].extra["blocks"] == {"base": [0, 0, 1, 1], "candidate": [0, 0, 1, 1]}
    payload["schema_version"] = 3
    path.write_text(json.dumps(payload))
    with pytest.raises(DataError, match=r"schema_version=3 is not one this gate reads \(1, 2\)"):
        load_results(path)
