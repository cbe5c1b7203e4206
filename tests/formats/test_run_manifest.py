"""run.json, written and read by one module (lockstep.formats.run_manifest): its exact bytes, how
lockstep tells its own from anyone else's, and the strict reading of its `skipped` list."""

from __future__ import annotations

import json

import pytest

from lockstep.errors import FormatError
from lockstep.formats import run_manifest


def test_written_with_the_schema_first_and_read_back(tmp_path):
    run_manifest.write_manifest(tmp_path, {"status": "running", "baseline": "pytorch",
                                           "skipped": [run_manifest.skip_entry("gpt2_3", "megatron", "needs 8 devices")]})
    assert (tmp_path / "run.json").read_bytes() == (
        b'{\n  "schema": "lockstep.run/1",\n  "status": "running",\n  "baseline": "pytorch",\n  "skipped": [\n'
        b'    {\n      "case": "gpt2_3",\n      "framework": "megatron",\n      "reason": "needs 8 devices"\n'
        b'    }\n  ]\n}\n')
    assert run_manifest.lockstep_manifest(tmp_path)[0]["status"] == "running"
    assert run_manifest.baseline_of(tmp_path) == "pytorch"
    assert run_manifest.skipped_pairs(tmp_path) == {"megatron": {"gpt2_3": "needs 8 devices"}}
    assert run_manifest.timing_of(tmp_path) is None  # not finished: no timing yet


@pytest.mark.parametrize("content, why", [
    (None, "no run.json"),
    ("{not json", "its run.json is not JSON, so lockstep did not write it"),
    ('{"schema": "lockstep.run/2"}', "its run.json is of another lockstep version (lockstep.run/2; this one reads lockstep.run/1)"),
    ('{"cases": []}', 'its run.json was not written by lockstep (it has no "schema": "lockstep.run/1")'),
])
def test_someone_elses_run_json_is_not_lockstep_s(tmp_path, content, why):
    if content is not None:
        (tmp_path / "run.json").write_text(content)
    doc, reason = run_manifest.lockstep_manifest(tmp_path)
    assert doc is None and reason.startswith(why)
    # The lenient reader takes any JSON object (compare and report read another tool's too).
    assert run_manifest.read_manifest(tmp_path) == (json.loads(content) if content and content[1] == '"' else {})
    with pytest.raises(Exception, match="so not a directory `lockstep run` wrote"):
        run_manifest.require_manifest(tmp_path)


def test_a_malformed_skipped_list_is_named(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"schema": "lockstep.run/1", "skipped": [{"case": "gpt2_1"}]}))
    with pytest.raises(FormatError, match=r"run.json: `skipped` must be a list of \{framework, case, reason\} strings"):
        run_manifest.skipped_pairs(tmp_path)
