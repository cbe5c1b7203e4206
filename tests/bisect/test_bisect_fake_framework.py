"""`lockstep bisect` end to end on a fake framework (tests/support/fake_framework.py): 16 commits after
the good one, a learning-rate defect at a known commit, one commit that does not build.

One bisect runs once for the module (8 commits trained, ~40 s on 2 cores); the other tests read
its OUT, resume it, or give bad input that is refused before anything is built.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from support.fake_framework import BUILD_LOG_ENV, DEFECT_SUBJECT, FakeRepo, git, make_fake_repo
from lockstep.cli import main
from lockstep.formats.run_record import read_run_record
from lockstep.outdir import locked_dir

COMMITS = 16
pytestmark = [pytest.mark.slow, pytest.mark.integration]


def bisect_args(repo: FakeRepo, out: Path, checkpoint: Path, tokens: Path, good: str | None = None,
                bad: str | None = None, build: str | None = "default") -> list[str]:
    args = ["bisect", "--repo", str(repo.path), "--good", good or repo.shas[0], "--bad", bad or repo.shas[-1],
            "--cases", "gpt2_1", "--steps", "3", "--device", "cpu", "--llmc", str(checkpoint), "--data", str(tokens),
            "--out", str(out)]
    build = repo.build_command if build == "default" else build
    return args + (["--build", build] if build is not None else [])


def built_shas(log: Path) -> list[str]:
    return log.read_text().split() if log.is_file() else []


@pytest.fixture(scope="module")
def bisected(tmp_path_factory, tiny_checkpoint, training_tokens):
    """The fake repository, bisected once (diagnose off: the fake has no --precision_check)."""
    root = tmp_path_factory.mktemp("bisect")
    repo = make_fake_repo(root / "repo", commits=COMMITS)
    builds = root / "builds.txt"
    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setenv(BUILD_LOG_ENV, str(builds))
        code = main(bisect_args(repo, root / "out", tiny_checkpoint, training_tokens) + ["--no-diagnose"])
    return {"repo": repo, "out": root / "out", "builds_log": builds, "code": code, "builds": built_shas(builds),
            "stdout": stdout.getvalue(),
            "result": json.loads((root / "out" / "bisect.json").read_text()),
            "markdown": (root / "out" / "bisect.md").read_text(), "root": root}


def test_finds_the_defect_commit_within_log2_builds(bisected):
    repo, result = bisected["repo"], bisected["result"]
    assert bisected["code"] == 0
    first = result["first_bad"]
    assert first["sha"] == repo.shas[repo.defect_index]
    assert first["subject"] == DEFECT_SUBJECT
    assert f"first bad commit: {first['sha']} {DEFECT_SUBJECT}" in bisected["stdout"]
    assert re.search(rf"{first['sha'][:10]} +│ {re.escape(DEFECT_SUBJECT[:30])}", bisected["stdout"])  # its row
    # The fake framework cannot show its step 1 (no --save/--precision_check): no certificate, so the
    # loss alone fails it, unexplained.
    assert first["verdict"] in ("FAIL", "FAIL unexplained") and first["failing_case"] == "gpt2_1"
    # LR x1.5 moves gpt2-tiny's loss by ~2e-4 within 3 steps, twenty times FP32's 1e-5.
    assert 1e-4 < first["max_abs_diff"] < 1e-3
    rows = {row["sha"]: row for row in result["tested"]}
    assert rows[repo.shas[0]]["state"] == "good" and rows[repo.shas[0]]["max_abs_diff"] < 1e-6
    assert rows[repo.shas[-1]]["state"] == "bad"
    # How builds are counted: the two endpoints are checked first; then git's bisection over the 16
    # commits of good..bad builds at most log2(16) + 1 commits that get a verdict, plus every
    # commit whose build failed (skipped: it tells git nothing about the range).
    bisection = result["tested"][2:]
    verdict_builds = [r for r in bisection if r["build"] == "ok"]
    skipped = [r for r in bisection if r["build"] == "failed"]
    assert result["commits_between"] == COMMITS
    assert len(verdict_builds) <= math.log2(COMMITS) + 1, [r["subject"] for r in bisection]
    assert skipped, "the commit that does not build was never picked"
    assert result["builds"] == 2 + len(verdict_builds) + len(skipped)
    # The fake's build.py logs each build that worked: the endpoints and the verdict builds, once each.
    assert sorted(bisected["builds"]) == sorted([repo.shas[0], repo.shas[-1]] + [r["sha"] for r in verdict_builds])


def test_a_commit_that_does_not_build_is_skipped_and_its_log_kept(bisected):
    repo, out = bisected["repo"], bisected["out"]
    broken = repo.shas[repo.broken_index]
    row = next(r for r in bisected["result"]["tested"] if r["sha"] == broken)
    assert (row["build"], row["state"], row["verdict"]) == ("failed", "skip", "NOT BUILT")
    assert "does not compile" in (out / "builds" / f"{broken}.log").read_text()
    assert not (out / "builds" / broken / ".lockstep-built").exists()
    assert "failed (skipped)" in bisected["markdown"]


def test_every_build_and_record_is_kept_and_the_users_checkout_is_untouched(bisected):
    repo, out, result = bisected["repo"], bisected["out"], bisected["result"]
    for row in result["tested"]:
        if row["build"] == "ok":
            assert (out / "builds" / row["sha"] / "gpt2").is_file()
            assert (out / "builds" / row["sha"] / "INFINITRAIN_COMMIT").read_text().strip() == row["sha"]
            record = out / "runs" / row["sha"] / "infinitrain" / "gpt2_1.jsonl"
            assert read_run_record(record).meta["infinitrain_commit"] == row["sha"]
        assert row["sha"][:10] in bisected["markdown"]
    assert not (out / "src").exists()  # the worktree is gone, the builds stay
    assert git(repo.path, "rev-parse", "HEAD") == repo.shas[-1]
    assert git(repo.path, "status", "--porcelain") == ""
    assert len(git(repo.path, "worktree", "list").splitlines()) == 1
    assert git(repo.path, "for-each-ref", "refs/bisect") == ""


def test_resume_rebuilds_nothing_and_reruns_only_the_interrupted_commit(bisected, tiny_checkpoint, training_tokens,
                                                                        monkeypatch):
    repo, out, first = bisected["repo"], bisected["out"], bisected["result"]
    # As if the bisect had been stopped while its last commit ran: that commit was built, not judged.
    last = first["tested"][-1]["sha"]
    (out / "tested" / f"{last}.json").unlink()
    shutil.rmtree(out / "runs" / last / "pytorch")
    builds = bisected["root"] / "resumed-builds.txt"
    monkeypatch.setenv(BUILD_LOG_ENV, str(builds))
    # With the diagnose this time: the fake cannot dump module outputs, which is said, not fatal.
    assert main(bisect_args(repo, out, tiny_checkpoint, training_tokens)) == 0
    again = json.loads((out / "bisect.json").read_text())
    assert built_shas(builds) == [] and again["builds"] == 0
    assert again["first_bad"]["sha"] == first["first_bad"]["sha"]
    assert [r["sha"] for r in again["tested"]] == [r["sha"] for r in first["tested"]]
    assert [(r["earlier"], r["build"]) for r in again["tested"]][-1] == (False, "reused")
    assert all(r["earlier"] for r in again["tested"][:-1])
    assert again["diagnose"]["command"].endswith("--case gpt2_1 --frameworks pytorch,infinitrain")
    assert "error" in again["diagnose"]


def test_endpoints_that_do_not_bracket_a_change_stop_with_both_verdicts(bisected, tiny_checkpoint, training_tokens,
                                                                        capsys):
    repo = bisected["repo"]
    # A commit after the defect that the module's bisect tested (which ones depends on git's path):
    # both endpoints are then answered from OUT/tested, with the same options into the same OUT.
    good_but_bad = next(r["sha"] for r in bisected["result"]["tested"][2:]
                        if r["state"] == "bad" and r["sha"] != repo.shas[repo.defect_index])
    assert main(bisect_args(repo, bisected["out"], tiny_checkpoint, training_tokens, good=good_but_bad)
                + ["--no-diagnose"]) == 1
    result = json.loads((bisected["out"] / "bisect.json").read_text())
    assert not result["found"] and result["builds"] == 0
    assert result["reason"].startswith("--good must judge good and --bad bad")
    assert (f"--good {good_but_bad[:10]} is bad (FAIL: gpt2_1 infinitrain vs pytorch: FAIL, "
            "max |Δloss| ") in result["reason"]
    assert f"--bad {repo.shas[-1][:10]} is bad (FAIL" in result["reason"]
    assert "no first bad commit" in capsys.readouterr().out


@pytest.mark.parametrize("problem", ["not a repo", "unknown rev", "good after bad", "no build command",
                                     "another bisect's out", "out in use"])
def test_bad_input_is_one_sentence_and_exit_1_before_any_build(problem, bisected, tmp_path, tiny_checkpoint,
                                                               training_tokens, capsys):
    repo = bisected["repo"]
    args = bisect_args(repo, tmp_path / "out", tiny_checkpoint, training_tokens)
    expected = {"not a repo": "is not a git repository", "unknown rev": "--bad v9.9 is not a commit",
                "good after bad": "is not an ancestor of --bad", "no build command": "no build command",
                "another bisect's out": "holds a bisect with other options (build differ)",
                "out in use": "is writing to this directory"}[problem]
    if problem == "not a repo":
        args[args.index("--repo") + 1] = str(tmp_path)
    elif problem == "unknown rev":
        args[args.index("--bad") + 1] = "v9.9"
    elif problem == "good after bad":
        args[args.index("--good") + 1], args[args.index("--bad") + 1] = repo.shas[-1], repo.shas[0]
    elif problem == "no build command":
        args = args[: args.index("--build")]
    elif problem == "another bisect's out":
        args[args.index("--out") + 1] = str(bisected["out"])
        args[args.index("--build") + 1] = "make gpt2"
    if problem == "out in use":
        with locked_dir(tmp_path / "out"):  # as a bisect still running there holds it
            assert main(args) == 1
    else:
        assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("lockstep: error: ") and expected in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "builds").exists()


def test_a_hanging_build_ends_the_bisection_with_one_sentence(tmp_path, tiny_checkpoint, training_tokens, capsys):
    """Both endpoints' builds hang (`sleep 1000`): each is stopped at --build-timeout with its process
    group, and bisect ends with exit 1 and the sentence saying why there is nothing to bisect."""
    repo = make_fake_repo(tmp_path / "repo", commits=2, defect_index=1, broken_index=99)
    pids = tmp_path / "sleeps.txt"
    code = main(bisect_args(repo, tmp_path / "out", tiny_checkpoint, training_tokens,
                            build=f"sleep 1000 & echo $! >> {pids}; wait") + ["--build-timeout", "1", "--no-diagnose"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    good, bad = repo.shas[0][:10], repo.shas[-1][:10]
    log = tmp_path / "out" / "builds" / f"{repo.shas[0]}.log"
    assert (f"no first bad commit: --good must judge good and --bad bad, so there is nothing to bisect: --good {good} is skip "
            f"(NOT BUILT: the build command ran past its timeout of 1 s and was stopped (--build-timeout) (log: "
            ) in out, out
    assert f"--bad {bad} is skip (NOT BUILT" in out and str(log) in out
    for pid in map(int, pids.read_text().split()):
        assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
