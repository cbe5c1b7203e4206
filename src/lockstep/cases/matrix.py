"""Case matrices as TOML: the built-in ones ship in `matrices/`, users pass their own file."""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path

from lockstep.cases.spec import CaseSpec
from lockstep.errors import CaseError, LockstepError


def builtin_matrices() -> dict[str, str]:
    """Built-in matrix name -> TOML text."""
    out = {}
    for entry in resources.files("lockstep.cases").joinpath("matrices").iterdir():
        if entry.name.endswith(".toml"):
            out[entry.name[: -len(".toml")]] = entry.read_text()
    return out


def load_matrix(name_or_path: str) -> list[CaseSpec]:
    """Load a built-in matrix by name (`gpt2`) or a user's TOML file by path."""
    builtins = builtin_matrices()
    if name_or_path in builtins:
        return parse_matrix(builtins[name_or_path], source=f"built-in matrix {name_or_path}")
    path = Path(name_or_path)
    if not path.is_file():
        raise LockstepError(f"{name_or_path}: no such matrix (built-in: {', '.join(sorted(builtins))}; or a .toml file)")
    return parse_matrix(path.read_text(), source=str(path))


def parse_matrix(text: str, source: str) -> list[CaseSpec]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LockstepError(f"{source}: not valid TOML ({e})") from None
    defaults = doc.get("defaults", {})
    raw_cases = doc.get("case", [])
    if not raw_cases:
        raise LockstepError(f"{source}: holds no [[case]] tables")
    cases, seen = [], set()
    for raw in raw_cases:
        d = {**defaults, **raw}
        try:
            case = CaseSpec.from_dict(d).check()
        except CaseError as e:
            raise CaseError(f"{source}: {e}") from None
        if case.name in seen:
            raise CaseError(f"{source}: case {case.name} is defined twice")
        seen.add(case.name)
        cases.append(case)
    return cases


def select_cases(cases: list[CaseSpec], names: list[str] | None, source: str = "the matrix") -> list[CaseSpec]:
    if not names:
        return cases
    by_name = {c.name: c for c in cases}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise CaseError(f"no case named {', '.join(missing)} in {source} (it has: {', '.join(by_name)})")
    return [by_name[n] for n in names]
