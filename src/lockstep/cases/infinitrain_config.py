"""InfiniTrain's own test matrix, `scripts/test_config.json`, read as it is.

The file (InfiniTrain b24d92f) holds `variables` (paths and switches for its shell driver,
`scripts/run_models_and_profile.bash`), `basic_compile_commands` (how it builds) and
`test_groups`: each group a `tag` (basic, zero, lora, checkpoint) and `tests`, each test an
`id` and the `args` its driver turns into `--key value` flags of the gpt2 and llama3 examples.
Every test runs once per family; its log, and so lockstep's case, is named `<family>_<id>`.

The MoE branch's file (feat/support_moe, b7e0760) adds a `moe` group for its `tiny_mixtral`
example (logs `tiny_mixtral_<id>`) and variables `GPT2_TEST_GROUPS`, `LLAMA3_TEST_GROUPS`,
`MIXTRAL_TEST_GROUPS` naming the groups each example runs (defaults basic,zero,lora,checkpoint for
gpt2 and llama3, moe for tiny_mixtral; `*` every group). A file with none of those variables is
read as b24d92f's driver reads it: gpt2 and llama3 run every group. A test id may repeat across
groups that no example shares (b7e0760's `1` is in basic and in moe); within one example's groups
it may not, since its logs would overwrite each other.

An arg is mapped to a `CaseSpec` field when lockstep has one for it; a test with any other arg is
skipped with a reason naming the arg (the plan's notes, one line per reason), never run without it. Args a test leaves out take the
defaults of the examples' flags (example/<family>/main.cc, DEFINE_*), so that a case trains
what InfiniTrain's run of the same test trains.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from lockstep.cases.lora_targets import unmatched_targets
from lockstep.cases.spec import CaseSpec, CheckpointSpec, LoraSpec, LRSchedule
from lockstep.errors import CaseError, LockstepError
from lockstep.fsutil import read_text

TOP_LEVEL_KEYS = ("variables", "basic_compile_commands", "builds", "test_groups", "tests")
FLAT_TESTS_TAG = "tests"  # the one group of a file with a flat `tests` list (release-0.5.0, the MetaX branches)
# arg -> (CaseSpec field, gflags type) of the args copied straight into a case's field. An arg neither
# here nor among the example's own flags (its adapter's test_config.arg_types) skips its test with
# the arg named. A CaseSpec field for a flag InfiniTrain has is one line here, e.g.
# "lr_decay_style": ("lr_decay_style", str).
CASE_FIELD_ARGS: dict[str, tuple[str, type]] = {
    # feat/activation_checkpointing: recompute must leave every bit of training unchanged
    "activation_recompute": ("activation_recompute", bool),
    "recompute_granularity": ("recompute_granularity", str),
    "recompute_method": ("recompute_method", str),
    "recompute_num_layers": ("recompute_num_layers", int),
}
# feat/lr_scheduler (merged upstream): the args of the case's LRSchedule, its fields of the same names.
LR_SCHEDULE_ARGS: dict[str, type] = {"lr_decay_style": str, "lr_warmup_iters": int, "lr_warmup_init": float,
                                     "lr_decay_iters": int, "min_lr": float}
# Args read but not mapped to a case field: what lockstep does instead, said in the plan's notes.
NOTED_ARGS = {"lora_load_path": "not read: lockstep starts LoRA from its own seeded init (the same in every framework)"}
SHELL_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
GROUP_KEYS = ("tag", "tests")
TEST_KEYS = ("id", "args")
# What each example is run as by the driver (its log name's prefix, default model, groups, flags and
# their defaults) is said by the family's InfiniTrain adapter (runners/infinitrain/families/<family>.py,
# `test_config`), found as the families are: no table of families here.


@functools.cache  # the families are fixed once lockstep.models is imported
def examples() -> dict:
    """family -> TestConfigExample of every family whose InfiniTrain adapter says the driver runs it,
    in the driver's order."""
    from lockstep.models import FAMILIES
    from lockstep.runners.registry import specs

    found = {}
    for fam in FAMILIES:
        try:
            adapter = specs()["infinitrain"].adapter(fam)
        except LockstepError:
            continue
        if adapter.test_config is not None:
            found[fam] = adapter.test_config
    return dict(sorted(found.items(), key=lambda kv: kv[1].order))


def _example(fam: str):
    return examples()[fam]


def _families_run() -> list[str]:
    return list(examples())


# Variables the driver itself reads, and what lockstep does instead.
DRIVER_VARIABLES = {
    "BUILD_DIR": "lockstep runs the InfiniTrain build given by --infinitrain-build (or LOCKSTEP_INFINITRAIN_BUILD)",
    "LOG_DIR": "logs go under the run directory (--out)",
    "PROFILE_LOG_DIR": "lockstep does not run InfiniTrain's profiling build",
    "CKPT_ROOT_DIR": "checkpoints go under the run directory (--out)",
    "COMPARE_LOG_DIR": "lockstep compares every framework with its pytorch reference (lockstep compare "
                       "compares two run directories)",
    "RUN_CTEST": "lockstep does not run InfiniTrain's ctest",
    "RUN_PROFILE_TEST": "lockstep does not run InfiniTrain's profiling build",
    "CTEST_CMD": "lockstep does not run InfiniTrain's ctest",
    "DEVICE_BACKEND": "InfiniTrain's driver passes it to the examples as --device; lockstep trains on the run's "
                      "--device (cpu or cuda), and cannot run another backend",
}


class TestSkipped(Exception):
    """A test lockstep cannot run: it is left out of the cases, named with the reason (the rest runs)."""

    __test__ = False
STEP_DIR = re.compile(r"^(?P<root>.*)/checkpoint_step_(?P<step>\d+)/?$")
VARIABLE_REF = re.compile(r"@([A-Za-z_][A-Za-z0-9_]*)@")


@dataclass(frozen=True)
class FamilyInputs:
    """A family's token file and LLMC init as the file's variables name them (None: not here)."""

    tokens: Path | None = None
    llmc: Path | None = None


@dataclass
class InfiniTrainMatrix:
    source: str
    groups: list[str]  # the file's group tags, in its order
    cases: list[CaseSpec]
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, FamilyInputs] = field(default_factory=dict)  # family -> the variables' paths found here
    skipped: dict[str, str] = field(default_factory=dict)  # case name -> why lockstep cannot run that test


def looks_like_test_config(name_or_path: str) -> bool:
    """A matrix argument naming an InfiniTrain test_config.json rather than a TOML matrix."""
    return name_or_path.endswith(".json")


def load_test_config(path: str | Path, model: str | None = None, groups: list[str] | None = None) -> InfiniTrainMatrix:
    """Read `path`; `model` (a family name or a registered shape of gpt2/llama3) picks the family,
    None both, as InfiniTrain's driver runs them; `groups` picks test groups by tag (None: all)."""
    source = str(path)
    text = read_text(Path(path), "InfiniTrain test config (JSON)")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise LockstepError(f"{source}: not valid JSON ({e})") from None
    return parse_test_config(doc, source, model, groups)


def parse_test_config(doc, source: str, model: str | None = None, groups: list[str] | None = None) -> InfiniTrainMatrix:
    if not isinstance(doc, dict):
        raise CaseError(f"{source}: holds {_json_type(doc)}, but an InfiniTrain test config is an object")
    unknown = [k for k in doc if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise CaseError(f"{source}: unknown top-level key(s) {', '.join(map(repr, unknown))} "
                        f"(an InfiniTrain test config holds {', '.join(TOP_LEVEL_KEYS)})")
    families = _families(model, source)
    notes: list[str] = []
    variables = _variables(doc.get("variables", {}), source)
    if "builds" in doc:
        if not isinstance(doc["builds"], list):
            raise CaseError(f"{source}: builds is {_json_type(doc['builds'])}, but it must be an array")
        notes.append(f"{source}: builds ({len(doc['builds'])}) not run: lockstep runs an existing InfiniTrain build")
    if "basic_compile_commands" in doc:
        if not isinstance(doc["basic_compile_commands"], list):
            raise CaseError(f"{source}: basic_compile_commands is {_json_type(doc['basic_compile_commands'])}, "
                            "but it must be an array")
        notes.append(f"{source}: basic_compile_commands not run: lockstep runs an existing InfiniTrain build")
    for name, instead in DRIVER_VARIABLES.items():
        if variables.get(name):
            notes.append(f"{source}: variables.{name} = {variables[name]!r} not used: {instead}")
    if "tests" in doc and "test_groups" in doc:
        raise CaseError(f"{source}: holds both tests and test_groups; an InfiniTrain test config holds one of them")
    raw_groups = doc.get("test_groups")
    if "tests" in doc:  # the flat list of release-0.5.0's driver: one group, run by gpt2 and llama3
        raw_groups = [{"tag": FLAT_TESTS_TAG, "tests": doc["tests"]}]
    if not isinstance(raw_groups, list) or not raw_groups:
        what = "missing" if raw_groups is None else f"{_json_type(raw_groups)}" + (" with no groups" if raw_groups == [] else "")
        raise CaseError(f"{source}: test_groups is {what}, but it must be an array of groups")
    tests = _tests(raw_groups, source)
    tags = list(dict.fromkeys(group for group, _, _ in tests))
    if groups:
        missing = [g for g in groups if g not in tags]
        if missing:
            raise CaseError(f"{source}: no test group {', '.join(map(repr, missing))} (its groups: {', '.join(tags)})")
    runs = {fam: _groups_of(fam, variables, tags) for fam, _ in families}
    if model is None:  # every example the driver would run on this file
        families = [(f, shape) for f, shape in families if any(g in runs[f] for g in tags)]
    for fam, _ in families:
        _check_ids(tests, runs[fam], fam, source)
        if _example(fam).groups_variable in variables:
            notes.append(f"{source}: variables.{_example(fam).groups_variable} = {variables[_example(fam).groups_variable]!r}: "
                         f"{_example(fam).log_prefix} runs group(s) {_listed(runs[fam])}")
    inputs = _inputs(variables, families, source, notes)
    saves = _save_roots(tests, variables, source)
    cases, skipped = [], {}
    zero_stage_build = any("zero_stage" in args for _, _, args in tests)
    for group, test_id, args in tests:
        if groups and group not in groups:
            continue
        for fam, shape in families:
            if group not in runs[fam]:
                continue
            name = f"{_example(fam).log_prefix}_{test_id}"
            try:
                case = _case(group, test_id, args, fam, shape, variables, saves, source, notes, zero_stage_build)
                if case.checkpoint is not None and case.checkpoint.resume_case in skipped:
                    raise TestSkipped(f"it resumes from {case.checkpoint.resume_case}, which is skipped")
                cases.append(case)
            except TestSkipped as e:
                skipped[name] = str(e)
    notes.extend(_skip_notes(skipped, source))
    if not cases:
        raise LockstepError(f"{source}: the selected groups hold no tests"
                            + (f" that {' or '.join(_example(f).log_prefix for f, _ in families)} runs ("
                               f"{'; '.join(f'{_example(f).log_prefix} runs group(s) {_listed(runs[f])}' for f, _ in families)})"
                               if families else ""))
    return InfiniTrainMatrix(source=source, groups=tags, cases=cases, notes=list(dict.fromkeys(notes)), inputs=inputs,
                             skipped=skipped)


def _skip_notes(skipped: dict[str, str], source: str) -> list[str]:
    """One line per reason, with its count and the tests it skips."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in skipped.items():
        by_reason.setdefault(reason, []).append(name)
    return [f"{source}: {len(names)} test(s) skipped: {reason}: {', '.join(names)}" for reason, names in by_reason.items()]


def _families(model: str | None, source: str) -> list[tuple[str, str]]:
    """(family, model shape) pairs the cases train."""
    if model is None:
        return [(f, _example(f).default_shape) for f in _families_run()]
    from lockstep.models import SHAPES

    if model not in SHAPES:
        raise LockstepError(f"unknown model {model!r}; known models: {', '.join(SHAPES)}")
    fam = SHAPES[model].family
    run = _families_run()
    if fam not in run:
        raise CaseError(f"{source}: InfiniTrain's test config runs {', '.join(_example(f).log_prefix for f in run[:-1])} "
                        f"and {_example(run[-1]).log_prefix}, but --model {model} is a {fam} model")
    return [(fam, model)]


def _variables(raw, source: str) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise CaseError(f"{source}: variables is {_json_type(raw)}, but it must be an object")
    out = {}
    for k, v in raw.items():
        if isinstance(v, (dict, list)) or v is None:
            raise CaseError(f"{source}: variables.{k} is {_json_type(v)}, but a variable is a string")
        out[k] = v if isinstance(v, str) else json.dumps(v)  # as jq -r prints it
    return out


def _inputs(variables: dict[str, str], families, source: str, notes: list[str]) -> dict[str, FamilyInputs]:
    out = {}
    for fam, _ in families:
        tokens_var, llmc_var = _example(fam).input_variables
        found = {}
        for var, ours in ((tokens_var, "lockstep's own token file"), (llmc_var, "lockstep's seeded init")):
            value = variables.get(var)
            if not value:
                continue
            if Path(value).is_file():
                found[var] = Path(value)
                flag = "--data" if var == tokens_var else "--llmc"
                notes.append(f"{source}: variables.{var} = {value} exists here, but {fam} cases train {ours} "
                             f"unless {flag} {value} is given")
            else:
                notes.append(f"{source}: variables.{var} = {value} does not exist here: {fam} cases train {ours}")
        out[fam] = FamilyInputs(tokens=found.get(tokens_var), llmc=found.get(llmc_var))
    return out


def _tests(raw_groups: list, source: str) -> list[tuple[str, str, dict]]:
    out = []
    for gi, group in enumerate(raw_groups, start=1):
        if not isinstance(group, dict):
            raise CaseError(f"{source}: test_groups #{gi} is {_json_type(group)}, but a group is an object")
        stray = [k for k in group if k not in GROUP_KEYS]
        tag = group.get("tag")
        if not isinstance(tag, str) or not tag:
            raise CaseError(f"{source}: test_groups #{gi} has no tag (a string naming the group)")
        if stray:
            raise CaseError(f"{source}: group {tag}: unknown key(s) {', '.join(map(repr, stray))} "
                            f"(a group holds {', '.join(GROUP_KEYS)})")
        tests = group.get("tests")
        if not isinstance(tests, list):
            raise CaseError(f"{source}: group {tag}: tests is {_json_type(tests)}, but it must be an array")
        for ti, test in enumerate(tests, start=1):
            if not isinstance(test, dict):
                raise CaseError(f"{source}: group {tag}: test #{ti} is {_json_type(test)}, but a test is an object")
            test_id = test.get("id")
            if not isinstance(test_id, str) or not test_id:
                raise CaseError(f"{source}: group {tag}: test #{ti} has no id (a string)")
            stray = [k for k in test if k not in TEST_KEYS]
            if stray:
                raise CaseError(f"{source}: test {test_id}: unknown key(s) {', '.join(map(repr, stray))} "
                                f"(a test holds {', '.join(TEST_KEYS)})")
            args = test.get("args", {})
            if not isinstance(args, dict):
                raise CaseError(f"{source}: test {test_id}: args is {_json_type(args)}, but it must be an object")
            out.append((tag, test_id, args))
    return out


def _groups_of(fam: str, variables: dict[str, str], tags: list[str]) -> list[str]:
    """The groups the driver runs `fam`'s example for: its *_TEST_GROUPS variable (`*`: all), that
    variable's default when the file sets another example's, every group when it sets none (b24d92f)."""
    if not any(e.groups_variable in variables for e in examples().values()):
        runs = _example(fam).groups_without_variables
        return list(tags) if runs is None else [t for t in tags if t in runs]
    raw = variables.get(_example(fam).groups_variable)
    if raw is None:
        return [t for t in tags if t in _example(fam).default_groups]
    named = [t.strip() for t in raw.split(",") if t.strip()]
    return list(tags) if "*" in named else [t for t in tags if t in named]


def _check_ids(tests, runs: list[str], fam: str, source: str) -> None:
    seen: dict[str, str] = {}
    for tag, test_id, _ in tests:
        if tag not in runs:
            continue
        if test_id in seen:
            raise CaseError(f"{source}: test {test_id} is defined twice (groups {seen[test_id]} and {tag}), both run "
                            f"by {_example(fam).log_prefix}; its logs would overwrite each other")
        seen[test_id] = tag


def _listed(groups: list[str]) -> str:
    return ", ".join(groups) or "none"


def _arg(args: dict, key: str, fam: str, test_id: str, source: str, variables: dict[str, str]):
    """The test's value of `key` (or the example's default), converted as gflags would."""
    if key not in args:
        return _example(fam).flag_defaults.get(key)
    value, want = args[key], _arg_types(fam)[key]
    where = f"{source}: test {test_id}: arg {key}"
    if isinstance(value, str):
        value = _substitute(value, variables, where)
    if want is str:
        if not isinstance(value, str):
            raise CaseError(f"{where} = {value!r} is {_json_type(value)}, but it must be a string")
        return value
    if isinstance(value, str):  # the driver passes `--key value` as text, and gflags parses it
        parsed = _parse_flag_text(value, want)
        if parsed is None:
            raise CaseError(f"{where} = {value!r} does not read as {_type_name(want)}")
        return parsed
    if want is bool:
        if not isinstance(value, bool):
            raise CaseError(f"{where} = {value!r} is {_json_type(value)}, but it must be a boolean")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (want is int and not float(value).is_integer()):
        raise CaseError(f"{where} = {value!r} is {_json_type(value)}, but it must be {_type_name(want)}")
    return want(value)


def _parse_flag_text(text: str, want: type):
    t = text.strip()
    if want is bool:
        return {"true": True, "1": True, "false": False, "0": False}.get(t.lower())
    try:
        return int(t) if want is int else float(t)
    except ValueError:
        return None


def _substitute(text: str, variables: dict[str, str], where: str) -> str:
    def value(m):
        if m.group(1) not in variables:
            raise CaseError(f"{where}: @{m.group(1)}@ is not one of the file's variables "
                            f"({', '.join(variables) or 'none'})")
        return variables[m.group(1)]

    return VARIABLE_REF.sub(value, text)


def _save_roots(tests, variables, source) -> dict[str, tuple[str, dict]]:
    """Each saving test's `save` folder (substituted) -> (test id, args)."""
    out = {}
    for _, test_id, args in tests:
        if isinstance(args.get("save"), str):
            root = _substitute(args["save"], variables, f"{source}: test {test_id}: arg save").rstrip("/")
            out.setdefault(root, (test_id, args))
    return out


def _arg_types(fam: str) -> dict[str, type]:
    return {**_example(fam).arg_types, **{k: t for k, (_, t) in CASE_FIELD_ARGS.items()}, **LR_SCHEDULE_ARGS}


def _known_args(args: dict, fam: str, test_id: str, source: str, notes: list[str], zero_stage_build: bool) -> dict:
    """The test's args lockstep maps, after the ones it notes, converts or skips the test for."""
    args = dict(args)
    for key, instead in NOTED_ARGS.items():
        if key in args:
            notes.append(f"{source}: test {test_id}: arg {key} = {args.pop(key)!r} {instead}")
    if "use_distributed_optimizer" in args and "zero_stage" not in _example(fam).arg_types:
        raise TestSkipped(f"arg use_distributed_optimizer is not a flag of {_example(fam).log_prefix}")
    if "use_distributed_optimizer" in args:
        if zero_stage_build:  # the file's build has zero_stage; the flag is a newer build's
            raise TestSkipped("arg use_distributed_optimizer: the file's other tests use zero_stage, so its own "
                              "build has no use_distributed_optimizer flag")
        on = args.pop("use_distributed_optimizer")
        if not isinstance(on, bool):
            raise CaseError(f"{source}: test {test_id}: arg use_distributed_optimizer = {on!r} is "
                            f"{_json_type(on)}, but it must be a boolean")
        args.setdefault("zero_stage", 1 if on else 0)  # ZeRO-1: optimizer state sharded over DP
    unknown = [k for k in args if k not in _arg_types(fam)]
    if unknown:
        raise TestSkipped(f"arg {unknown[0]} is not one lockstep maps to a case yet" if len(unknown) == 1 else
                          f"args {', '.join(sorted(unknown))} are not ones lockstep maps to a case yet")
    for key, value in args.items():
        if isinstance(value, str) and SHELL_VARIABLE.search(value):
            raise TestSkipped(f"arg {key} = {value!r} names a shell variable of InfiniTrain's driver")
    return args


def _case(group: str, test_id: str, args: dict, fam: str, shape: str, variables: dict[str, str],
          saves: dict, source: str, notes: list[str], zero_stage_build: bool = False) -> CaseSpec:
    args = _known_args(args, fam, test_id, source, notes, zero_stage_build)

    def arg(key):
        return _arg(args, key, fam, test_id, source, variables)

    if _example(fam).sequence_batches:
        return _sequence_batch_case(group, test_id, arg, fam, shape, source)

    world, tp, pp = arg("nthread_per_process"), arg("tensor_parallel"), arg("pipeline_parallel")
    for key, v in (("nthread_per_process", world), ("tensor_parallel", tp), ("pipeline_parallel", pp)):
        if v < 1:
            raise CaseError(f"{source}: test {test_id}: arg {key} is {v}, must be at least 1")
    if world % (tp * pp):
        raise CaseError(f"{source}: test {test_id}: nthread_per_process {world} is not a multiple of "
                        f"tensor_parallel x pipeline_parallel = {tp} x {pp}, so it has no data-parallel size")
    name = f"{_example(fam).log_prefix}_{test_id}"
    case = CaseSpec(name=name, model=shape, dtype=arg("dtype"), micro_batch=arg("batch_size"),
                    seq_len=arg("sequence_length"), total_batch=arg("total_batch_size"), steps=arg("num_iteration"),
                    lr=arg("learning_rate"), dp=world // (tp * pp), tp=tp, pp=pp,
                    vpp=arg("virtual_pipeline_parallel"), sp=arg("sequence_parallel"), zero=arg("zero_stage"),
                    lora=_lora(args, arg, fam, test_id, source, notes),
                    checkpoint=_checkpoint(args, arg, fam, test_id, saves, variables, source), group=group,
                    lr_schedule=_lr_schedule(args, arg),
                    **{f: arg(k) for k, (f, _) in CASE_FIELD_ARGS.items() if k in args})
    try:
        return case.check()
    except CaseError as e:
        raise CaseError(f"{source}: test {test_id}: {e}") from None


def _lr_schedule(args: dict, arg) -> LRSchedule | None:
    """The test's LR schedule where it sets any of its args (the others at InfiniTrain's defaults)."""
    given = {k: arg(k) for k in LR_SCHEDULE_ARGS if k in args}
    return LRSchedule(**given) if given else None


def _sequence_batch_case(group: str, test_id: str, arg, fam: str, shape: str, source: str) -> CaseSpec:
    """tiny_mixtral's flags: its batch sizes count sequences (global = micro x accumulation), one device."""
    micro, global_batch, seq = arg("micro_batch_size"), arg("global_batch_size"), arg("sequence_length")
    if micro < 1 or global_batch % micro:
        raise CaseError(f"{source}: test {test_id}: global_batch_size {global_batch} is not a multiple of "
                        f"micro_batch_size {micro}, as {_example(fam).log_prefix} requires")
    case = CaseSpec(name=f"{_example(fam).log_prefix}_{test_id}", model=shape, dtype=arg("dtype"), micro_batch=micro,
                    seq_len=seq, total_batch=global_batch * seq, steps=arg("num_iteration"), lr=arg("learning_rate"),
                    group=group)
    try:
        return case.check()
    except CaseError as e:
        raise CaseError(f"{source}: test {test_id}: {e}") from None


def _lora(args: dict, arg, fam: str, test_id: str, source: str, notes: list[str]) -> LoraSpec | None:
    rank = arg("lora_rank")
    if rank == 0:
        ignored = [k for k in ("lora_alpha", "lora_target_modules") if k in args]
        if ignored:
            notes.append(f"{source}: test {test_id}: {', '.join(ignored)} set but lora_rank is 0 (LoRA off), "
                         "as InfiniTrain ignores them")
        return None
    targets = tuple(dict.fromkeys(t.strip() for t in arg("lora_target_modules").split(",") if t.strip()))
    bad = unmatched_targets(fam, targets)
    if bad:
        raise CaseError(f"{source}: test {test_id}: arg lora_target_modules: {', '.join(bad)} names no linear "
                        f"layer of {fam} (InfiniTrain would adapt nothing there)")
    return LoraSpec(rank=rank, alpha=arg("lora_alpha"), target_modules=targets)


def _checkpoint(args: dict, arg, fam: str, test_id: str, saves: dict, variables: dict[str, str],
                source: str) -> CheckpointSpec | None:
    if not any(k in args for k in ("save", "load", "save_interval")):
        return None
    where = f"{source}: test {test_id}"
    save, interval = arg("save") if "save" in args else "", arg("save_interval")
    # The examples refuse either without the other (example/gpt2/main.cc, LOG(FATAL) "Invalid configuration").
    if save and interval == 0:
        raise CaseError(f"{where}: arg save is set but save_interval is 0; InfiniTrain refuses to start")
    if interval > 0 and not save:
        raise CaseError(f"{where}: arg save_interval is {interval} but save is not set; InfiniTrain refuses to start")
    resume_from = resume_case = None
    if "load" in args:
        load = arg("load")
        if save and (load.rstrip("/") + "/").startswith(save.rstrip("/") + "/"):
            raise CaseError(f"{where}: arg load = {load!r} is inside the test's own save folder {save!r}; "
                            "a test cannot resume from the checkpoints it is writing")
        m = STEP_DIR.match(load)
        if not m:
            raise CaseError(f"{where}: arg load = {load!r} is not a <save folder>/checkpoint_step_NNNNNN "
                            "folder, so lockstep cannot tell the step it resumes from")
        resume_from = int(m.group("step"))
        saver = saves.get(m.group("root").rstrip("/"))
        if saver is None:
            raise CaseError(f"{where}: arg load = {load!r} is no checkpoint a test of the file saves "
                            "(lockstep resumes only from a run it made)")
        saver_id, saver_args = saver
        saved, kept = _saved_steps(saver_args, fam, saver_id, source, variables)
        if resume_from not in saved:
            raise CaseError(f"{where}: arg load asks for step {resume_from}, but test {saver_id} saves steps "
                            f"{', '.join(map(str, saved)) or 'none'}")
        if resume_from not in kept:
            raise CaseError(f"{where}: arg load asks for step {resume_from}, but test {saver_id} keeps only steps "
                            f"{', '.join(map(str, kept))} (max_checkpoint_keep)")
        resume_case = f"{_example(fam).log_prefix}_{saver_id}"
    return CheckpointSpec(save_interval=interval, resume_from=resume_from, resume_case=resume_case,
                          save_optimizer_state=arg("save_optimizer_state"), max_checkpoint_keep=arg("max_checkpoint_keep"))


def _saved_steps(args: dict, fam: str, test_id: str, source: str, variables) -> tuple[list[int], list[int]]:
    """The steps a saving test writes (every save_interval and the last) and those left after
    pruning to the newest max_checkpoint_keep (example/gpt2/main.cc, checkpoint_manager.cc)."""
    steps = _arg(args, "num_iteration", fam, test_id, source, variables)
    interval = _arg(args, "save_interval", fam, test_id, source, variables)
    keep = _arg(args, "max_checkpoint_keep", fam, test_id, source, variables)
    saved = [s for s in range(1, steps + 1) if interval and (s % interval == 0 or s == steps)]
    return saved, (saved[-keep:] if keep > 0 else saved)


def _json_type(value) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def _type_name(t: type) -> str:
    return {int: "an integer", float: "a number", bool: "a boolean", str: "a string"}[t]
