"""`lockstep diagnose`: where two frameworks first part on step 1 of a case, and what kind of defect it is.

Each framework's runner captures step 1 with whole tensors (FrameworkRunner.capture); certify/
compares and classifies them; here: run (plan, captures, drift, files), verdict (the findings plus
the drift) and render (terminal and the HTML report's section). With --at-step N (stepcheck/state.py) the
step compared is N+1, every framework starting it from the reference's state after step N.
"""


def hint(case: str, baseline: str, test: str, run_dir: str | None = None) -> str:
    """The command that diagnoses a FAIL (printed by run and compare)."""
    where = f"{run_dir} " if run_dir else ""
    return f"lockstep diagnose {where}--case {case} --frameworks {baseline},{test}"
