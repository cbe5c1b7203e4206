"""The git side of `lockstep bisect`: the user's repository, a worktree of it, and git's own
bisection in that worktree.

The bisection runs in a linked worktree under OUT, whose bisect state (BISECT_*, refs/bisect/)
is its own: the user's checkout, its HEAD and any bisection of theirs are never touched. It runs
`--no-checkout` and lockstep checks out each commit itself with `--force`, so that a build that
touched tracked files cannot stop the next checkout.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from lockstep.errors import LockstepError

FIRST_BAD_RE = re.compile(r"^([0-9a-f]{40}) is the first bad commit", re.MULTILINE)
ONLY_SKIPPED = "There are only 'skip'ped commits left to test"
SHA_LINE_RE = re.compile(r"^([0-9a-f]{40})$", re.MULTILINE)


class BisectError(LockstepError):
    """`lockstep bisect` cannot go on: a bad repository or revision, a git command that failed."""


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str
    author_date: str  # ISO 8601, as git prints %aI

    @property
    def short(self) -> str:
        return self.sha[:10]

    def to_json(self) -> dict:
        return {"sha": self.sha, "subject": self.subject, "author_date": self.author_date}


@dataclass(frozen=True)
class BisectStep:
    """Where git's bisection stands after a mark: the next commit to test, the first bad commit,
    or only skipped commits left (then `candidates` could each be the first bad one)."""

    next_sha: str | None = None
    first_bad: str | None = None
    candidates: tuple[str, ...] = ()


def git(args: list[str], cwd: Path | None = None, check: bool = True, what: str = "") -> subprocess.CompletedProcess:
    """Run git with untranslated messages (they are parsed) and no prompts; a failure raises
    BisectError with git's own last line."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "GIT_TERMINAL_PROMPT": "0"}
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    except OSError as e:
        raise BisectError(f"cannot run git ({e.strerror or e}); lockstep bisect needs git on PATH") from None
    if check and proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        where = f" in {cwd}" if cwd else ""
        raise BisectError(f"git {' '.join(args[:2])}{where} failed" + (f" ({what})" if what else "")
                          + (f": {said[-1]}" if said else f" with status {proc.returncode}"))
    return proc


def check_repository(repo: Path) -> Path:
    """The absolute path of a git repository (a work tree or a bare repository)."""
    repo = Path(repo).expanduser()
    if not repo.is_dir():
        raise BisectError(f"{repo}: --repo is not a directory")
    proc = git(["rev-parse", "--git-dir"], cwd=repo, check=False)
    if proc.returncode != 0:
        raise BisectError(f"{repo}: --repo is not a git repository")
    return repo.resolve()


def resolve_commit(repo: Path, rev: str, option: str) -> str:
    """The full sha of `rev`; one sentence naming the option and the repository when it is none."""
    proc = git(["rev-parse", "--verify", "--quiet", "--end-of-options", f"{rev}^{{commit}}"], cwd=repo, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise BisectError(f"{repo}: {option} {rev} is not a commit of this repository")
    return proc.stdout.strip()


def is_ancestor(repo: Path, ancestor: str, descendant: str) -> bool:
    return git(["merge-base", "--is-ancestor", ancestor, descendant], cwd=repo, check=False).returncode == 0


def commits_between(repo: Path, good: str, bad: str) -> int:
    """How many commits git's bisection chooses among: those reachable from bad but not from good."""
    return int(git(["rev-list", "--count", f"{good}..{bad}"], cwd=repo).stdout.strip())


def commit_info(repo: Path, sha: str) -> Commit:
    out = git(["show", "-s", "--format=%H%x00%s%x00%aI", sha], cwd=repo).stdout.strip()
    full, subject, date = out.split("\0")
    return Commit(full, subject, date)


class Worktree:
    """A detached worktree of the user's repository at `path`, removed again by `remove()`
    (builds live elsewhere and stay)."""

    def __init__(self, repo: Path, path: Path):
        self.repo = repo
        self.path = Path(path).absolute()

    def add(self, rev: str) -> None:
        self._remove_leftover()
        git(["worktree", "add", "--detach", "--force", str(self.path), rev], cwd=self.repo,
            what=f"creating the worktree {self.path}")

    def checkout(self, sha: str) -> None:
        git(["checkout", "--quiet", "--force", "--detach", sha], cwd=self.path, what=f"checking out {sha[:10]}")

    def remove(self) -> None:
        if self.path.exists():
            git(["worktree", "remove", "--force", "--force", str(self.path)], cwd=self.repo, check=False)
        if self.path.exists():  # not (or no longer) registered as a worktree: only files
            shutil.rmtree(self.path, ignore_errors=True)
        git(["worktree", "prune"], cwd=self.repo, check=False)

    def _remove_leftover(self) -> None:
        """A worktree an interrupted bisect left behind (killed before its clean-up) goes first."""
        if self.path.exists() or self.path.is_symlink():
            self.remove()
        else:
            git(["worktree", "prune"], cwd=self.repo, check=False)

    # ------------------------------------------------------------------ git's bisection

    def bisect_start(self, good: str, bad: str) -> BisectStep:
        git(["bisect", "reset"], cwd=self.path, check=False)  # an earlier, unfinished bisection of this worktree
        return self._bisect(["start", "--no-checkout", bad, good])

    def bisect_mark(self, sha: str, state: str) -> BisectStep:
        """Tell git what `sha` is: "good", "bad" or "skip"."""
        return self._bisect([state, sha])

    def _bisect(self, args: list[str]) -> BisectStep:
        proc = git(["bisect", *args], cwd=self.path, check=False)
        text = proc.stdout + proc.stderr
        found = FIRST_BAD_RE.search(text)
        if found:
            return BisectStep(first_bad=found.group(1))
        if ONLY_SKIPPED in text:
            return BisectStep(candidates=tuple(SHA_LINE_RE.findall(text)))
        if proc.returncode != 0:
            said = text.strip().splitlines()
            raise BisectError(f"git bisect {args[0]} in {self.path} failed: {said[-1] if said else proc.returncode}")
        head = git(["rev-parse", "--verify", "BISECT_HEAD"], cwd=self.path).stdout.strip()
        return BisectStep(next_sha=head)
