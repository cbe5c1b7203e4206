"""Case matrices as TOML: the built-in ones ship in `matrices/`, users pass their own file.

A matrix holds `[defaults]` (a table) and `[[case]]` (an array of tables) and nothing else;
every other key, a value of the wrong type and a model lockstep has no shape for are errors
naming the file and the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from lockstep.cases.infinitrain_config import load_test_config, looks_like_test_config
from lockstep.cases.lora_targets import LORA_LINEARS, unmatched_targets
from lockstep.cases.spec import FIELD_TYPES, CaseSpec
from lockstep.errors import CaseError, LockstepError
from lockstep.fsutil import read_text

TOP_LEVEL_KEYS = ("defaults", "case")


def registered_model_shapes() -> set[str]:
    """The `model` values a case may name: the registered model shapes (one place to change
    should the registry move)."""
    from lockstep.models import SHAPES

    return set(SHAPES)


def builtin_matrices() -> dict[str, str]:
    """Built-in matrix name -> TOML text."""
    out = {}
    for entry in resources.files("lockstep.cases").joinpath("matrices").iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = entry.read_text()
    return out


def load_matrix(name_or_path: str, model: str | None = None, groups: list[str] | None = None,
                notes: list[str] | None = None) -> list[CaseSpec]:
    """Load a built-in matrix by name (`gpt2`), a user's TOML file by path, or InfiniTrain's
    `test_config.json` (cases/infinitrain_config.py: `model` picks its family, None both;
    `groups` its test groups by tag). What the loader did in place of the file's settings is
    appended to `notes` (the plan's notes)."""
    builtins = builtin_matrices()
    if groups and not looks_like_test_config(name_or_path):
        raise LockstepError(f"--groups picks the test groups of InfiniTrain's test_config.json, but {name_or_path} "
                            "is a TOML matrix (pick its cases with --cases)")
    if name_or_path in builtins:
        return parse_matrix(builtins[name_or_path], source=f"built-in matrix {name_or_path}")
    path = Path(name_or_path)
    if not path.exists():
        raise LockstepError(f"{name_or_path}: no such matrix (built-in: {', '.join(sorted(builtins))}; "
                            "or a .toml file, or InfiniTrain's test_config.json)")
    if looks_like_test_config(name_or_path):
        matrix = load_test_config(path, model=model, groups=groups)
        if notes is not None:
            notes.extend(matrix.notes)
        return matrix.cases
    return parse_matrix(read_text(path, "case matrix (TOML)"), source=str(path))


def _type(value) -> str:
    return {dict: "a table", list: "an array", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number"}.get(type(value), type(value).__name__)


def parse_matrix(text: str, source: str) -> list[CaseSpec]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LockstepError(f"{source}: not valid TOML ({e})") from None
    unknown = [k for k in doc if k not in TOP_LEVEL_KEYS]
    if unknown:
        raise CaseError(f"{source}: unknown top-level key(s) {', '.join(map(repr, unknown))}; "
                        "a matrix holds only [defaults] and [[case]] tables")
    defaults = doc.get("defaults", {})
    if not isinstance(defaults, dict):
        raise CaseError(f"{source}: defaults is {_type(defaults)}, but it must be a table ([defaults])")
    stray = sorted(set(defaults) - set(FIELD_TYPES))
    if stray:
        raise CaseError(f"{source}: unknown key(s) {', '.join(map(repr, stray))} in [defaults] "
                        f"(known: {', '.join(sorted(FIELD_TYPES))})")
    raw_cases = doc.get("case", [])
    if not isinstance(raw_cases, list) or not all(isinstance(c, dict) for c in raw_cases):
        what = _type(raw_cases) if not isinstance(raw_cases, list) else "an array holding non-tables"
        raise CaseError(f"{source}: case is {what}, but it must be an array of tables ([[case]])")
    if not raw_cases:
        raise LockstepError(f"{source}: holds no [[case]] tables")
    shapes = registered_model_shapes()
    cases, seen = [], set()
    for i, raw in enumerate(raw_cases, start=1):
        d = {**defaults, **raw}
        try:
            case = CaseSpec.from_dict(d).check()
        except CaseError as e:
            msg = str(e)
            msg = f"[[case]] #{i}{msg[len('a case'):]}" if msg.startswith("a case") else msg
            raise CaseError(f"{source}: {msg}") from None
        if case.model not in shapes:
            raise CaseError(f"{source}: case {case.name}: model {case.model!r} is not a registered model "
                            f"(known: {', '.join(sorted(shapes))})")
        _check_lora_targets(case, source)
        if case.name in seen:
            raise CaseError(f"{source}: case {case.name} is defined twice")
        seen.add(case.name)
        cases.append(case)
    return cases


def _check_lora_targets(case: CaseSpec, source: str) -> None:
    """A target that names no linear layer is refused here, as InfiniTrain's test config reader
    refuses it: at run time it would adapt nothing there and fail late."""
    if case.lora is None:
        return
    from lockstep.models import SHAPES

    family = SHAPES[case.model].family
    bad = unmatched_targets(family, case.lora.target_modules)
    if bad:
        raise CaseError(f"{source}: case {case.name}: lora target_modules: {', '.join(bad)} names no linear layer "
                        f"of {family} (known: {', '.join(LORA_LINEARS.get(family, ())) or 'none'})")


def select_cases(cases: list[CaseSpec], names: list[str] | None, source: str = "the matrix") -> list[CaseSpec]:
    if not names:
        return cases
    by_name = {c.name: c for c in cases}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise CaseError(f"no case named {', '.join(missing)} in {source} (it has: {', '.join(by_name)})")
    return [by_name[n] for n in names]
