"""InfiniTrain's native checkpoint folder (`checkpoint_step_NNNNNN/`) as its family's LLMC file.

The model's tensors are InfiniTrain's module names; `families.py`'s `canonical_state` (the
mapping the step-1 capture uses) turns them into LLMC names. The shape comes from an LLMC file
(`like`, e.g. the init the run started from) or a registered shape (`model`); a GPT-2 checkpoint
needs neither, its tensors and trainer state give every header field (Vp: V rounded up to 128,
as llm.c pads it). The trainer state's shape must agree with it, and every canonical tensor must
be there with its LLMC shape; otherwise one sentence and nothing written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lockstep.errors import FormatError
from lockstep.formats.infinitrain_checkpoint import CheckpointFolder, read_checkpoint_folder
from lockstep.fsutil import check_writable_target

LLMC_VOCAB_PADDING = 128  # llm.c pads GPT-2's vocabulary to a multiple of 128 (50257 -> 50304)


@dataclass
class InfiniTrainConversion:
    source: Path
    out: Path
    family: str
    config: object
    step: int | None
    dropped: list[str]  # InfiniTrain tensors that are no LLMC tensor (e.g. a separate lm_head copy)


def family_of_names(names: list[str]) -> str:
    """gpt2 or llama3, from the module names InfiniTrain's two examples give their layers."""
    if any(n.endswith("mlp.c_fc2.weight") for n in names):
        return "llama3"
    if any(n.endswith("ln_1.bias") for n in names) or "transformer.wpe.weight" in names:
        return "gpt2"
    raise LookupError


def convert_infinitrain_checkpoint(folder_path: str | os.PathLike, out: str | os.PathLike,
                                   like: str | os.PathLike | None = None, model: str | None = None) -> InfiniTrainConversion:
    from lockstep.models import family as model_family
    from lockstep.models import model_shape, read_checkpoint_layout
    from lockstep.runners.infinitrain.families import adapter_for

    out = check_writable_target(out, "LLMC checkpoint")
    folder = read_checkpoint_folder(folder_path)
    if folder.problems:
        raise FormatError(folder.path, f"not a complete checkpoint: {folder.problems[0]}"
                                       + (f" (and {len(folder.problems) - 1} more problem(s); lockstep inspect "
                                          f"{folder.path} lists them)" if len(folder.problems) > 1 else ""))
    state = folder.trainer_state
    if state.values["tp_size"] > 1 or state.values["pp_size"] > 1:
        raise FormatError(folder.path, f"its topology {state.topology} shards the model over ranks; converting a "
                                       "TP or PP checkpoint (joining its shards) is not supported yet")
    rank = folder.ranks[0]  # DP replicas hold the same model
    names = rank.model.names
    if like is not None:
        fam, layout = read_checkpoint_layout(like)
        config, fam_name = layout.config, fam.name
    elif model is not None:
        shape = model_shape(model)
        config, fam_name = shape.config, shape.family
    else:
        try:
            fam_name = family_of_names(names)
        except LookupError:
            raise FormatError(rank.model.path, "its tensor names are neither InfiniTrain's GPT-2 nor its Llama 3 "
                                               "module names") from None
        if fam_name != "gpt2":
            raise FormatError(folder.path, f"a {fam_name} checkpoint does not give every LLMC header field (RoPE "
                                           "theta, norm eps, FFN multiplier); name the shape with --like FILE.bin or "
                                           "--model")
        config = _gpt2_config(folder)
    _check_shape(folder, config)
    fam = model_family(fam_name)
    raw = {e.name: rank.model.array(e) for e in rank.model.entries}
    canonical = adapter_for(fam_name).canonical_state({k: v for k, v in raw.items()
                                                        if v.dtype == np.float32}, config)
    tensors = _stack(canonical, config, rank.model.path)
    used = _used_names(fam_name, raw, config)
    fam.write(out, config, tensors)
    fam.read_layout(out)  # the header decodes and the size is exact, or FormatError
    return InfiniTrainConversion(source=folder.path, out=out, family=fam_name, config=config, step=folder.step,
                                 dropped=sorted(n for n in raw if n not in used))


def _gpt2_config(folder: CheckpointFolder):
    from lockstep.models.gpt2.config import GPT2Config

    v = folder.trainer_state.values
    model = folder.ranks[0].model
    try:
        max_t = model.entry("transformer.wpe.weight").shape[0]
    except KeyError:
        raise FormatError(model.path, "has no transformer.wpe.weight, so the maximum sequence length is unknown") from None
    vocab = int(v["vocab_size"])
    padded = -(-vocab // LLMC_VOCAB_PADDING) * LLMC_VOCAB_PADDING
    return GPT2Config(max_seq_len=max_t, vocab_size=vocab, num_layers=int(v["n_layer"]), num_heads=int(v["n_head"]),
                      channels=int(v["n_embd"]), padded_vocab_size=padded)


def _check_shape(folder: CheckpointFolder, config) -> None:
    v = folder.trainer_state.values
    ours = {"n_layer": config.num_layers, "n_head": config.num_heads, "n_kv_head": config.num_kv_heads,
            "n_embd": config.channels, "vocab_size": config.vocab_size}
    for key, want in ours.items():
        if v[key] != want:
            raise FormatError(folder.trainer_state.path, f"{key} is {v[key]}, but the model shape asked for has "
                                                         f"{want} ({config.describe()})")


def _stack(canonical: dict[str, np.ndarray], config, path: Path) -> dict[str, np.ndarray]:
    """Canonical tensors (`qkvw[3]`) -> LLMC tensors stacked over layers, each shape checked."""
    out = {}
    for name, shape in config.tensor_shapes():
        if name in config.PER_LAYER:
            parts = []
            for layer in range(config.num_layers):
                key = f"{name}[{layer}]"
                if key not in canonical:
                    raise FormatError(path, f"has no tensor for LLMC {key}")
                parts.append(canonical[key])
            t = np.stack(parts)
        else:
            if name not in canonical:
                raise FormatError(path, f"has no tensor for LLMC {name}")
            t = canonical[name]
        if tuple(t.shape) != tuple(shape):
            raise FormatError(path, f"LLMC {name} comes out {list(t.shape)}, the shape {config.describe()} needs "
                                    f"{list(shape)}")
        out[name] = np.ascontiguousarray(t, dtype=np.float32)
    return out


def _used_names(fam_name: str, raw: dict[str, np.ndarray], config) -> set[str]:
    """The InfiniTrain names that became an LLMC tensor (each mapped alone)."""
    from lockstep.runners.infinitrain.families import adapter_for

    adapter = adapter_for(fam_name)
    return {n for n, a in raw.items() if a.dtype == np.float32 and adapter.canonical_state({n: a}, config)}
