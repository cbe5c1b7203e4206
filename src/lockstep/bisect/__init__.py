"""`lockstep bisect`: which commit of the framework under test moved the loss.

Data flow: the user's repository -> a worktree of it under OUT (never the user's checkout) ->
git's bisection over it, one commit at a time: build (the user's command, into
OUT/builds/<sha>) -> `lockstep run` into OUT/runs/<sha> -> one judge (judge.py) reading the
run's summary -> good / bad / skip back to git -> OUT/bisect.json and OUT/bisect.md.

Every tested commit's outcome is kept in OUT/tested/<sha>.json, so that re-running the same
command resumes: git's bisection starts over and every commit it already answered is answered
again from there, without building or running anything.
"""
