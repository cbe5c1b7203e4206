"""`lockstep diagnose`: name the first divergence between two frameworks on one case."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from lockstep.commands.arguments import split_list, timeout_argument
from lockstep.formats.run_manifest import manifest_path as run_manifest_path
from lockstep.runners import add_runner_arguments, framework_names, framework_options_from


def add_parser(sub) -> None:
    p = sub.add_parser("diagnose", help="name the first module or gradient where two frameworks part",
                       description="Run step 1 of one case on two frameworks and compare every module output and "
                                   "every gradient under canonical LLMC names; add the loss drift at a few learning "
                                   "rates; classify each finding. RUN_DIR diagnoses a case of an existing run with "
                                   "the same inputs.")
    p.add_argument("run_dir", nargs="?", metavar="RUN_DIR", help="a directory `lockstep run` wrote (optional)")
    p.add_argument("--case", required=True, help="the case to diagnose (e.g. gpt2_1)")
    p.add_argument("--frameworks", help=f"BASE,TEST[,TEST...] from {', '.join(framework_names())} (default: as `lockstep run`; "
                                        "with RUN_DIR its baseline and the frameworks that failed the case)")
    p.add_argument("--matrix", default="gpt2", help="built-in matrix name or a TOML file (as for run)")
    p.add_argument("--model", help="a registered model of the case's family (as for run)")
    p.add_argument("--llmc", help="LLMC checkpoint to start from (as for run)")
    p.add_argument("--data", help="llm.c token file (as for run)")
    p.add_argument("--text", help="text file to tokenize as the corpus (as for run)")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when available")
    p.add_argument("--out", default=None, help="run directory; the verdict goes to OUT/diagnose/ (default: lockstep-out, "
                                               "or RUN_DIR)")
    p.add_argument("--seed", type=int, default=42, help="seed of the llm.c init when no --llmc is given")
    p.add_argument("--timeout", type=timeout_argument, default=None, help="seconds per framework run before it fails")
    add_runner_arguments(p)  # each runner's own flags, as for run (--infinitrain-build, ...)
    p.add_argument("--at-step", type=int, default=0, metavar="N",
                   help="compare step N+1 instead of step 1, every framework starting it from the reference's state "
                        "after step N (its weights, optimizer state and data position, made once by training the "
                        "reference N steps, loaded by each framework in its own checkpoint format); also compares "
                        "the update each optimizer applies. For defects that show only after step 1 (default 0: step 1)")
    p.add_argument("--drift-steps", type=int, default=5, help="steps per lr of the drift runs (default 5)")
    p.add_argument("--no-drift", action="store_true", help="skip the loss drift at lr 1e-12, 1e-5 and the case's lr")
    p.add_argument("--keep-tensors", action="store_true",
                   help="keep the step-1 captures' whole tensors in OUT/diagnose/*.npz (default: only their sketches "
                        "and norms once the verdict is written, a few MB instead of hundreds)")
    p.add_argument("--history", type=Path, default=None, metavar="FILE",
                   help="with RUN_DIR: history database whose trends the rewritten report.html shows (default: as "
                        "`lockstep report`, $LOCKSTEP_HISTORY, else the user's data dir)")
    p.add_argument("--no-history", action="store_true", help="with RUN_DIR: the rewritten report has no history section")
    p.set_defaults(handler=run)


def run(args) -> int:
    from lockstep.diagnose.render import print_verdict
    from lockstep.diagnose.run import DiagnoseRequest, plan_diagnose, run_diagnose, verdict_path

    console = Console(width=None if Console().is_terminal else 140)
    req = DiagnoseRequest(case=args.case, run_dir=args.run_dir, frameworks=split_list(args.frameworks),
                          matrix=args.matrix, model=args.model, llmc=args.llmc, data=args.data, text=args.text,
                          device=args.device, out=args.out, seed=args.seed, timeout_s=args.timeout,
                          framework_options=framework_options_from(args), drift=not args.no_drift,
                          drift_steps=args.drift_steps, keep_tensors=args.keep_tensors, at_step=args.at_step)
    plan = plan_diagnose(req)
    at = (f" | at step {plan.at_step + 1}, from the reference's state after step {plan.at_step}" if plan.at_step
          else "")
    console.print(f"diagnose {plan.case.name} ({plan.case.dtype} {plan.case.parallel_label}, {plan.inputs.model_name}) | "
                  f"{', '.join(plan.frameworks[1:])} vs {plan.frameworks[0]}{at} | device {plan.inputs.device} | "
                  f"out {plan.out_dir}", highlight=False)
    verdicts = run_diagnose(plan, drift=req.drift, drift_steps=req.drift_steps,
                            say=lambda text: console.print(f"[dim]{text}[/dim]", highlight=False),
                            keep_tensors=req.keep_tensors)
    for v in verdicts:
        print_verdict(console, v.to_json())
        console.print(f"verdict: {verdict_path(plan.out_dir, v)}")
    if plan.run_dir is not None and run_manifest_path(plan.run_dir).is_file():
        from lockstep.commands.ci_options import history_path

        html = rewrite_report(plan.run_dir, plan.frameworks[0], history_path(args))
        console.print(f"report (with a diagnose section): {html}")
    return 1 if any(v.findings for v in verdicts) else 0


def rewrite_report(run_dir: Path, baseline: str, history: Path | None) -> Path:
    """The run's report again, now with the diagnose section, and with everything else it had: the
    History section too (it was left out when diagnose rewrote it without the history database)."""
    from lockstep.report import write_report

    html, _ = write_report(run_dir, baseline_framework=baseline, history_path=history)
    return html
