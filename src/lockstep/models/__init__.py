"""Model families and the shapes registered for them, found by looking at `models/`.

Every subpackage of this package that defines `FAMILY` (a `ModelFamily`) and `SHAPES` is a
family: adding one is adding its folder, with no table here to edit (docs/contributing.md).
A family may also live outside lockstep, in a package of the user's: its family folders are
found the same way when the package is named by the environment variable
`LOCKSTEP_FAMILY_PACKAGES` (comma-separated module names) or by an entry point of the group
`lockstep.families` (its value a module name). Both reach megatron's torchrun workers, which
inherit the environment and the installed distributions.
`FAMILIES` maps a family name (gpt2, llama3, qwen3, mixtral) to its `ModelFamily`; `SHAPES` maps a model
name (gpt2, gpt2-tiny, llama3, llama3-tiny, qwen3-1.7b, ...) to a `ModelShape`. Nothing outside
`models/` and the runners' per-family adapters names a family.
"""

from __future__ import annotations

import importlib
import os
import pkgutil

from lockstep.errors import FormatError, LockstepError
from lockstep.formats import llmc
from lockstep.models.family import ModelFamily, ModelShape


FAMILY_PACKAGES_VARIABLE = "LOCKSTEP_FAMILY_PACKAGES"
ENTRY_POINT_GROUP = "lockstep.families"


def _folders_in(package: str) -> list:
    """Every subpackage of `package` that defines FAMILY, in name order."""
    try:
        parent = importlib.import_module(package)
    except ImportError as e:
        raise LockstepError(f"family package {package!r} (named by {FAMILY_PACKAGES_VARIABLE} or the entry-point "
                            f"group {ENTRY_POINT_GROUP}) cannot be imported: {e}") from None
    found = []
    for info in sorted(pkgutil.iter_modules(getattr(parent, "__path__", [])), key=lambda m: m.name):
        if info.ispkg:
            module = importlib.import_module(f"{package}.{info.name}")
            if isinstance(getattr(module, "FAMILY", None), ModelFamily):
                found.append(module)
    return found


def family_packages() -> list[str]:
    """The packages whose subpackages are family folders: lockstep's own, then the user's."""
    from importlib.metadata import entry_points

    named = [p.strip() for p in os.environ.get(FAMILY_PACKAGES_VARIABLE, "").split(",") if p.strip()]
    named += [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return list(dict.fromkeys([__name__, *named]))


def _family_folders() -> list:
    found, seen = [], {}
    for package in family_packages():
        for module in _folders_in(package):
            name = module.FAMILY.name
            if name in seen:
                raise LockstepError(f"two folders define model family {name!r}: {seen[name]} and {module.__name__}")
            seen[name] = module.__name__
            found.append(module)
    return found


_FOLDERS = _family_folders()
FAMILIES: dict[str, ModelFamily] = {f.FAMILY.name: f.FAMILY for f in _FOLDERS}
# family -> its folder's module (e.g. lockstep.models.gpt2), where a runner also looks for its adapter.
FAMILY_MODULES: dict[str, str] = {f.FAMILY.name: f.__name__ for f in _FOLDERS}
SHAPES: dict[str, ModelShape] = {s.name: s for f in _FOLDERS for s in getattr(f, "SHAPES", ())}
# family -> the shape a CPU-only machine trains instead (each family's FAMILY.cpu_shape).
CPU_SHAPES: dict[str, str] = {name: f.cpu_shape for name, f in FAMILIES.items() if f.cpu_shape}


def family(name: str) -> ModelFamily:
    try:
        return FAMILIES[name]
    except KeyError:
        raise LockstepError(f"unknown model family {name!r}; known: {', '.join(FAMILIES)}") from None


def model_shape(name: str) -> ModelShape:
    try:
        return SHAPES[name]
    except KeyError:
        raise LockstepError(f"unknown model {name!r}; known models: {', '.join(SHAPES)}") from None


def cpu_shape(family_name: str) -> str | None:
    """The shape a CPU-only machine trains instead of a larger one of the family (FAMILY.cpu_shape)."""
    return family(family_name).cpu_shape


def family_of_config(config) -> ModelFamily:
    return family(config.family)


def family_of_checkpoint(path: str | os.PathLike) -> ModelFamily:
    """The family whose LLMC magic number the file starts with."""
    header, _ = llmc.read_header(path)
    magic = int(header[0])
    for fam in FAMILIES.values():
        if fam.magic == magic:
            return fam
    known = ", ".join(f"{f.magic} ({f.title})" for f in FAMILIES.values())
    raise FormatError(path, f"unknown checkpoint magic number {magic}; known: {known}")


def read_checkpoint_layout(path: str | os.PathLike) -> tuple[ModelFamily, llmc.CheckpointLayout]:
    """Identify, decode and size-check an LLMC checkpoint of any family (tensors not read)."""
    fam = family_of_checkpoint(path)
    return fam, fam.read_layout(path)


def load_checkpoint(path: str | os.PathLike) -> llmc.LLMCCheckpoint:
    return family_of_checkpoint(path).load(path)


def config_from_dict(d: dict):
    """A family config back from its `to_dict()` (e.g. a worker's copy of the planned model)."""
    return family(d["family"]).config_type.from_dict(d)
