"""Read one side of a case into a checked RunRecord, applying the Megatron-LM step-2 correction
where the options and the record's origin call for it."""

from __future__ import annotations

from dataclasses import dataclass

from lockstep.compare.options import CompareOptions
from lockstep.errors import LockstepError
from lockstep.formats.logs import (ORIGIN_LOCKSTEP, ORIGIN_LOCKSTEP_MEGATRON, ORIGIN_MEGATRON_LM, ParsedRuns,
                                   correct_megatron_step2, load_with)
from lockstep.formats.run_record import RunRecord, check_steps
from lockstep.compare.pairing import CaseFile

# Records holding true per-step losses by construction: the correction must never touch them.
LOCKSTEP_ORIGINS = (ORIGIN_LOCKSTEP, ORIGIN_LOCKSTEP_MEGATRON)


def wants_step2_correction(record: RunRecord, mode: str) -> bool:
    """auto: upstream Megatron-LM logs only. on: also any foreign record of framework "megatron"
    (e.g. a Megatron-LM log converted to a run record by another tool). off: never.
    lockstep's own records and logs are never corrected, whatever the mode."""
    if mode == "off" or record.origin in LOCKSTEP_ORIGINS:
        return False
    if record.origin == ORIGIN_MEGATRON_LM:
        return True
    return mode == "on" and record.framework == "megatron"


@dataclass
class LoadedSide:
    file: CaseFile
    record: RunRecord | None = None
    error: str | None = None  # one sentence naming the file
    step2_corrected: bool = False


def load_side(file: CaseFile, options: CompareOptions, files: ParsedRuns | None = None) -> LoadedSide:
    """Never raises for a bad file: the error is kept so that the other cases are still compared.
    `files`: the run's files parsed once (ParsedRuns), where the caller keeps them."""
    side = LoadedSide(file)
    try:
        record = load_with(files, file.path, seq_length=options.seq_length)
        check_steps(record)
        if wants_step2_correction(record, options.megatron_step2_correction):
            record = correct_megatron_step2(record)
            side.step2_corrected = bool(record.meta.get("megatron_step2_corrected"))
        side.record = record
    except LockstepError as e:
        side.error = str(e)
    return side
