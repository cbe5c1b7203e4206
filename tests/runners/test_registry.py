"""Runners and families describe themselves: every registered family is complete for every runner
(an adapter, or a reason why not), and nothing at the CLI's start imports a framework."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import types

import pytest

from lockstep.models import CPU_SHAPES, FAMILIES, SHAPES
from lockstep.runners import (RUNNER_PACKAGES, add_runner_arguments, default_frameworks, framework_options_from,
                              get_runner, reference_framework, specs)
from lockstep.runners.registry import Capabilities, RunnerSpec, family_gaps


def test_every_registered_family_has_an_adapter_for_every_runner_that_needs_one():
    assert set(FAMILIES) == {"gpt2", "llama3", "qwen3", "mixtral"}
    assert family_gaps(FAMILIES, specs().values()) == []
    for spec in specs().values():
        if spec.capabilities.family_adapters:
            for family in FAMILIES:
                if (family not in spec.capabilities.unsupported_families
                        and spec.name not in FAMILIES[family].unsupported_runners):
                    assert spec.adapter(family) is not None, (spec.name, family)


def test_a_family_missing_an_adapter_is_named(monkeypatch):
    """Negative control: a fake family that no runner has an adapter for, nor declares unsupported."""
    gaps = family_gaps([*FAMILIES, "fakefam"], specs().values())
    needing = sorted(n for n, s in specs().items() if s.capabilities.family_adapters)
    assert needing == ["infinitrain", "megatron", "megatron-fast", "megatron-te"]
    assert len(gaps) == len(needing)
    for name in needing:
        assert any(g.startswith(f"{name} has no adapter for model family 'fakefam'") for g in gaps), gaps
    # Declared unsupported with a reason: complete; without one: still a gap.
    declared = [dataclasses.replace(s, capabilities=dataclasses.replace(
        s.capabilities, unsupported_families={"fakefam": "its executable has no such model"})) for s in specs().values()]
    assert family_gaps([*FAMILIES, "fakefam"], declared) == []
    silent = [dataclasses.replace(s, capabilities=dataclasses.replace(s.capabilities,
                                                                     unsupported_families={"fakefam": " "}))
              for s in specs().values() if s.name == "megatron"]
    assert family_gaps(["fakefam"], silent) == ["megatron declares model family 'fakefam' unsupported without a reason"]


def test_a_family_folder_may_say_why_a_runner_cannot_train_it(monkeypatch, tmp_path):
    """A family declares in its own folder which runners cannot train it, and why: complete, and
    those runners skip its cases with that reason."""
    from lockstep.models import FAMILIES as families
    from lockstep.runners.base import RunInputs

    fake = dataclasses.replace(families["gpt2"], name="fakefam", title="Fake",
                               unsupported_runners={"megatron": "its attention has no megatron-core switch",
                                                    "infinitrain": "InfiniTrain has no executable for it"})
    monkeypatch.setitem(families, "fakefam", fake)
    assert family_gaps(["fakefam"], specs().values()) == []
    inputs = RunInputs(checkpoint=tmp_path / "x.bin", tokens=tmp_path / "t.bin",
                       model=_FakeConfig(SHAPES["gpt2-tiny"].config), device="cpu")
    reason = get_runner("infinitrain", build_dir=str(tmp_path)).skip_reason(_case(), inputs)
    assert reason == "infinitrain cannot train Fake models: InfiniTrain has no executable for it"
    get_runner("infinitrain", build_dir=str(tmp_path)).preflight(inputs)  # its cases skip; the run is not refused
    reason = get_runner("megatron").skip_reason(_case(), inputs)
    assert reason is None or reason.startswith(("megatron cannot train Fake models", "megatron-core is not installed"))


class _FakeConfig:
    """A gpt2-tiny config that says it is of the fake family."""

    def __init__(self, config):
        self._config = config

    family = "fakefam"

    def __getattr__(self, name):
        return getattr(self._config, name)


def _case():
    from lockstep.cases.spec import CaseSpec

    return CaseSpec(name="c", model="gpt2-tiny", dtype="float32", micro_batch=4, seq_len=64, total_batch=256, steps=1,
                    lr=1e-4)


def test_an_adapter_module_without_adapter_is_a_gap(monkeypatch):
    module = types.ModuleType("lockstep_fake_adapters.fakefam")
    package = types.ModuleType("lockstep_fake_adapters")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "lockstep_fake_adapters", package)
    monkeypatch.setitem(sys.modules, "lockstep_fake_adapters.fakefam", module)
    module.__spec__ = types.SimpleNamespace(name=module.__name__)
    spec = RunnerSpec(name="x", runner="m:C", summary="", capabilities=Capabilities(family_adapters="lockstep_fake_adapters"))
    assert family_gaps(["fakefam"], [spec]) == ["lockstep_fake_adapters.fakefam defines no ADAPTER"]
    module.ADAPTER = object()
    assert family_gaps(["fakefam"], [spec]) == []


def test_families_declare_their_own_cpu_shape_and_tokenizer():
    assert CPU_SHAPES == {"gpt2": "gpt2-tiny", "llama3": "llama3-tiny", "qwen3": "qwen3-tiny", "mixtral": "mixtral-tiny"}
    for name, fam in FAMILIES.items():
        assert SHAPES[fam.cpu_shape].family == name
        from lockstep.data.tokenizers import tokenizer_spec

        assert tokenizer_spec(fam.tokenizer).name == fam.tokenizer


def test_specs_name_every_registered_package():
    assert list(specs()) == ["pytorch", "pytorch-fast", "megatron", "megatron-fast", "megatron-te", "torchtitan", "infinitrain",
                             "command"]
    assert len(RUNNER_PACKAGES) == len(specs())
    assert reference_framework() == "pytorch"
    assert {n for n, s in specs().items() if s.capabilities.build_option} == {"infinitrain", "command"}


def test_cli_flags_come_from_the_runners_and_keep_their_names(monkeypatch):
    parser = argparse.ArgumentParser()
    add_runner_arguments(parser)
    args = parser.parse_args(["--infinitrain-build", "/b", "--megatron-native-bf16"])
    options = framework_options_from(args)
    assert options["infinitrain"].build_dir == "/b" and options["megatron"].native_bf16 is True
    assert get_runner("infinitrain", options).build_dir.as_posix() == "/b"
    assert get_runner("megatron", options).options.native_bf16 is True
    defaults = framework_options_from(parser.parse_args([]))
    monkeypatch.delenv("LOCKSTEP_INFINITRAIN_BUILD", raising=False)
    assert default_frameworks(defaults)[0] == "pytorch" and "infinitrain" not in default_frameworks(defaults)
    monkeypatch.setenv("LOCKSTEP_INFINITRAIN_BUILD", "/b")
    assert "infinitrain" in default_frameworks(defaults)


def test_megatron_left_out_of_the_defaults_says_why(monkeypatch):
    import lockstep.runners.megatron as megatron

    monkeypatch.setattr(megatron, "megatron_core_installed", lambda: False)
    notes: list[str] = []
    assert "megatron" not in default_frameworks({}, notes)
    assert notes == ["megatron-core is not installed (pip install 'lockstep[megatron]'): megatron is left out"]


def test_the_cli_starts_without_importing_any_framework():
    """Building every command's parser reads every runner's spec, and imports no runner module,
    no torch and no megatron-core."""
    code = ("import sys; from lockstep.cli import build_parser; build_parser(); "
            "from lockstep.runners import specs; specs(); "
            "bad = sorted(m for m in sys.modules if m.startswith(('torch', 'megatron')) or "
            "m.endswith(('.runner', '.worker', '.train')) and m.startswith('lockstep.runners')); print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("name", ["megatron", "infinitrain", "pytorch", "pytorch-fast"])
def test_runner_classes_are_imported_when_asked_for(name):
    runner = get_runner(name)
    assert runner.name == name


@pytest.mark.parametrize("command", ["run", "diagnose", "bisect"])
def test_the_user_facing_flags_keep_their_names(command):
    """Each runner's own flags reach run, diagnose and bisect under the names they always had."""
    from lockstep.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    flags = {s for a in sub._actions for s in a.option_strings}
    assert {"--infinitrain-build", "--megatron-native-bf16", "--command-runner", "--command-build"} <= flags
