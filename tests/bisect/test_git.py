"""git's side of `lockstep bisect`, on small repositories with no training: a worktree that is
the bisection's own, and what git answers after each mark."""

from __future__ import annotations

from pathlib import Path

from lockstep.bisect.git import Worktree, commits_between, is_ancestor, resolve_commit
from support.fake_framework import git


def linear_repo(path: Path, n: int) -> list[str]:
    path.mkdir()
    git(path, "init", "-q", "-b", "main")
    shas = []
    for i in range(n):
        (path / "f").write_text(f"{i}\n")
        git(path, "add", "f")
        git(path, "commit", "-q", "-m", f"c{i}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def test_bisection_in_a_worktree_finds_the_first_bad_commit_and_leaves_the_checkout_alone(tmp_path):
    shas = linear_repo(tmp_path / "repo", 9)
    first_bad = 5
    wt = Worktree(tmp_path / "repo", tmp_path / "out" / "src")
    wt.add(shas[0])
    try:
        step = wt.bisect_start(shas[0], shas[-1])
        tested = []
        while step.next_sha:
            tested.append(step.next_sha)
            wt.checkout(step.next_sha)
            assert git(wt.path, "rev-parse", "HEAD") == step.next_sha
            step = wt.bisect_mark(step.next_sha, "bad" if shas.index(step.next_sha) >= first_bad else "good")
        assert step.first_bad == shas[first_bad] and len(tested) <= 3  # 8 commits: log2(8)
    finally:
        wt.remove()
    assert not wt.path.exists()
    assert git(tmp_path / "repo", "rev-parse", "HEAD") == shas[-1]
    assert len(git(tmp_path / "repo", "worktree", "list").splitlines()) == 1


def test_only_skipped_commits_left_names_every_candidate(tmp_path):
    shas = linear_repo(tmp_path / "repo", 5)
    wt = Worktree(tmp_path / "repo", tmp_path / "src")
    wt.add(shas[0])
    try:
        step = wt.bisect_start(shas[0], shas[-1])
        while step.next_sha:
            step = wt.bisect_mark(step.next_sha, "skip")
    finally:
        wt.remove()
    assert step.first_bad is None and sorted(step.candidates) == sorted(shas[1:])


def test_adjacent_endpoints_name_the_bad_one_at_once(tmp_path):
    shas = linear_repo(tmp_path / "repo", 2)
    wt = Worktree(tmp_path / "repo", tmp_path / "src")
    wt.add(shas[0])
    try:
        assert wt.bisect_start(shas[0], shas[1]).first_bad == shas[1]
    finally:
        wt.remove()


def test_a_worktree_left_by_a_killed_bisect_is_replaced(tmp_path):
    shas = linear_repo(tmp_path / "repo", 3)
    Worktree(tmp_path / "repo", tmp_path / "src").add(shas[1])  # never removed: its bisect was killed
    wt = Worktree(tmp_path / "repo", tmp_path / "src")
    wt.add(shas[0])
    try:
        assert git(wt.path, "rev-parse", "HEAD") == shas[0]
        assert len(git(tmp_path / "repo", "worktree", "list").splitlines()) == 2
    finally:
        wt.remove()


def test_revisions_and_ancestry(tmp_path):
    repo = tmp_path / "repo"
    shas = linear_repo(repo, 4)
    assert resolve_commit(repo, "main~3", "--good") == shas[0]
    assert is_ancestor(repo, shas[0], shas[3]) and not is_ancestor(repo, shas[3], shas[0])
    assert commits_between(repo, shas[0], shas[3]) == 3
