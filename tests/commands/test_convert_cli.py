"""`lockstep convert --from-hf` through `lockstep.cli.main`: its summary, bad inputs refused with one
sentence and nothing left at --out, and `lockstep run --llmc` starting from a converted file (its
step-1 loss is transformers' loss on the same batch), or refusing one with scaled RoPE."""

from __future__ import annotations


import numpy as np
import pytest

from lockstep.cli import main
from lockstep.formats.run_record import read_run_record
from lockstep.formats.tokens import read_token_stream
from lockstep.fsutil import sha256_file

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from support.hf_models import build, save  # noqa: E402
from support.cli_output import printed


def convert(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["convert", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory):
    return save(build("llama3"), tmp_path_factory.mktemp("llama3") / "hf")


def test_summary_names_what_the_conversion_did(capsys, tmp_path, llama_folder):
    out_file = tmp_path / "ckpt" / "llama.bin"
    rc, out, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))
    assert (rc, err) == (0, "")
    assert out.splitlines()[0] == f"wrote {out_file}"
    assert printed(out, "from") == f"{llama_folder} (model_type llama; one file, fp32)"
    assert printed(out, "model") == "llama3: L=2 NH=4 kv=2 C=64 FFN=192 V=256 maxT=128"
    assert printed(out, "format") == "LLMC Llama 3 version 3 (fp32)"
    assert printed(out, "conversion") == ("q_proj/k_proj rows un-permuted from HF's half-split RoPE order to Meta's "
                                          "interleaved pairs")
    assert "intermediate_size 192 written as ffn_dim_multiplier 1.12941, multiple_of 64" in out
    assert printed(out, "bytes") == f"{out_file.stat().st_size:,}"
    assert printed(out, "sha256") == sha256_file(out_file)
    assert [p.name for p in out_file.parent.iterdir()] == ["llama.bin"]  # no temporary file left behind


def broken(tmp_path, llama_folder, how: str):
    """A copy of the Llama checkpoint broken one way; returns (folder, extra argv, the error's start)."""
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(llama_folder, folder)
    weights = folder / "model.safetensors"
    if how == "no config.json":
        (folder / "config.json").unlink()
        return folder, [], f"{folder / 'config.json'}: no such file"
    if how == "config.json not JSON":
        (folder / "config.json").write_text("{not json")
        return folder, [], f"{folder / 'config.json'}: is not valid JSON"
    if how == "no weights":
        weights.unlink()
        return folder, [], f"{folder}: holds neither model.safetensors nor model.safetensors.index.json"
    if how == "not safetensors":
        weights.write_bytes(b"\x00" * 64)
        return folder, [], f"{weights}: is not a readable safetensors file"
    if how == "wrong family":
        return folder, ["--family", "qwen3"], (f"{folder / 'config.json'}: model_type is 'llama', a Llama 3 checkpoint, "
                                               "but --family qwen3 asks for Qwen3 (model_type 'qwen3')")
    tensors = safetensors_numpy.load_file(str(weights))
    if how == "wrong shape":
        tensors["model.layers.1.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"][:100]
        message = (f"{weights}: tensor model.layers.1.mlp.up_proj.weight has shape (100, 64), but config.json's "
                   "Llama 3 shape (L=2 NH=4 kv=2 C=64 FFN=192 V=256) needs (192, 64)")
    elif how == "missing tensor":
        del tensors["model.layers.0.self_attn.k_proj.weight"]
        message = (f"{folder}: tensor model.layers.0.self_attn.k_proj.weight is missing; config.json's Llama 3 shape "
                   "(L=2 NH=4 kv=2 C=64 FFN=192 V=256) needs it")
    elif how == "extra tensor":
        tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
        message = (f"{weights}: holds tensor model.layers.0.self_attn.q_proj.bias, which the LLMC Llama 3 format has "
                   "no place for; converting would drop it")
    else:
        raise ValueError(how)
    safetensors_numpy.save_file(tensors, str(weights))
    return folder, [], message


BREAKAGES = ["no config.json", "config.json not JSON", "no weights", "not safetensors", "wrong family", "wrong shape",
             "missing tensor", "extra tensor"]


@pytest.mark.parametrize("how", BREAKAGES)
def test_bad_checkpoint_is_one_sentence_and_leaves_nothing(capsys, tmp_path, llama_folder, how):
    folder, extra, message = broken(tmp_path, llama_folder, how)
    out_file = tmp_path / "out" / "model.bin"
    rc, out, err = convert(capsys, "--from-hf", str(folder), "--out", str(out_file), *extra)
    assert rc == 1 and "Traceback" not in err and out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"lockstep: error: {message}"), err
    assert not (tmp_path / "out").exists()


def test_missing_shard_is_named(capsys, tmp_path, llama_folder):
    model = build("llama3")
    folder = save(model, tmp_path / "sharded", max_shard_size="100KB")
    shard = sorted(folder.glob("model-*.safetensors"))[1]
    shard.unlink()
    rc, _, err = convert(capsys, "--from-hf", str(folder), "--out", str(tmp_path / "m.bin"))
    assert rc == 1
    assert err == f"lockstep: error: {shard}: no such file, but model.safetensors.index.json lists it as a shard\n"
    assert not (tmp_path / "m.bin").exists()


def test_failure_while_writing_keeps_the_previous_file(capsys, tmp_path, llama_folder, monkeypatch):
    """A tensor that cannot be read half-way through the write: the old --out stays as it was, no temporary file."""
    from lockstep.formats.hf_checkpoint import HFCheckpoint
    from lockstep.errors import FormatError

    out_file = tmp_path / "model.bin"
    assert convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))[0] == 0
    previous = sha256_file(out_file)
    real_read = HFCheckpoint.read

    def failing_read(self, name):
        if name == "model.layers.1.mlp.down_proj.weight":
            raise FormatError(self.directory / "model.safetensors", f"tensor {name} cannot be read")
        return real_read(self, name)

    monkeypatch.setattr(HFCheckpoint, "read", failing_read)
    rc, _, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))
    assert rc == 1 and "cannot be read" in err
    assert sha256_file(out_file) == previous
    assert [p.name for p in tmp_path.iterdir()] == ["model.bin"]


def test_run_starts_from_the_converted_weights(capsys, tmp_path, training_tokens):
    """GPT-2 with the real vocabulary (tiny otherwise): lockstep run's step-1 loss on the converted
    file is transformers' loss on the same first batch (gpt2_1: B=4, T=64, tokens 0..256)."""
    model = build("gpt2", vocab_size=50257, n_positions=128, n_layer=1, bos_token_id=50256, eos_token_id=50256)
    folder = save(model, tmp_path / "hf")
    ckpt = tmp_path / "gpt2_converted.bin"
    assert convert(capsys, "--from-hf", str(folder), "--family", "gpt2", "--out", str(ckpt))[0] == 0
    rc = main(["run", "--llmc", str(ckpt), "--data", str(training_tokens), "--frameworks", "pytorch", "--cases",
               "gpt2_1", "--steps", "2", "--device", "cpu", "--out", str(tmp_path / "run"), "--no-report"])
    out, err = capsys.readouterr()
    assert rc == 1 and "RAN: pytorch only (one framework): nothing was compared" in out, err  # trained, compared with nothing
    losses = read_run_record(tmp_path / "run" / "pytorch" / "gpt2_1.jsonl").losses()
    tokens = np.asarray(read_token_stream(training_tokens).tokens[:257], dtype=np.int64)
    x, y = torch.from_numpy(tokens[:-1].reshape(4, 64)), torch.from_numpy(tokens[1:].reshape(4, 64))
    with torch.no_grad():
        logits = model(x).logits
    expected = torch.nn.functional.cross_entropy(logits.double().view(-1, 50257), y.view(-1)).item()
    assert abs(losses[0] - expected) <= 1e-5, (losses[0], expected)


def test_run_refuses_a_scaled_rope_file(capsys, tmp_path):
    scaling = {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
               "original_max_position_embeddings": 8192}
    folder = save(build("llama3", rope_scaling=scaling), tmp_path / "hf")
    scaled, plain = tmp_path / "scaled.bin", tmp_path / "plain.bin"
    rc, out, _ = convert(capsys, "--from-hf", str(folder), "--out", str(scaled))
    assert rc == 0 and "written as use_scaled_rope 1" in out
    assert np.fromfile(scaled, dtype="<i4", count=13)[12] == 1
    assert convert(capsys, "--from-hf", str(folder), "--out", str(plain), "--no-rope-scaling")[0] == 0
    assert np.fromfile(plain, dtype="<i4", count=13)[12] == 0
    rc = main(["run", "--matrix", "llama3", "--cases", "llama3_1", "--frameworks", "pytorch", "--llmc", str(scaled),
               "--device", "cpu", "--out", str(tmp_path / "run")])
    _, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in err
    assert err == (f"lockstep: error: {scaled}: use_scaled_rope is 1 (Llama 3.1 RoPE scaling), which lockstep's "
                   "frameworks do not implement; convert with `lockstep convert --no-rope-scaling` to train it with "
                   "plain RoPE\n")
    assert not (tmp_path / "run").exists()


def test_rope_scaling_beside_rope_parameters_that_disagree_is_refused(capsys, tmp_path, llama_folder):
    """transformers 5 loads such a config.json from rope_scaling alone (yarn here, rope_theta back to
    its default 10000); lockstep once read rope_parameters over it and wrote plain RoPE, theta 500000."""
    import json
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(llama_folder, folder)
    config = json.loads((folder / "config.json").read_text())
    assert config["rope_parameters"] == {"rope_theta": 500000.0, "rope_type": "default"}
    config["rope_scaling"] = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}
    (folder / "config.json").write_text(json.dumps(config))
    loaded = transformers.AutoConfig.from_pretrained(folder).rope_parameters
    assert (loaded["rope_type"], loaded["rope_theta"]) == ("yarn", 10000.0)  # what transformers runs
    out_file = tmp_path / "out" / "model.bin"
    rc, out, err = convert(capsys, "--from-hf", str(folder), "--out", str(out_file))
    assert (rc, out) == (1, "")
    assert err == (f"lockstep: error: {folder / 'config.json'}: holds both rope_scaling (yarn, factor 4.0, "
                   "original_max_position_embeddings 32) and rope_parameters (default, rope_theta 500000.0), which "
                   "disagree; transformers loads the model from rope_scaling and ignores rope_parameters, so remove "
                   "the one that is wrong\n")
    assert not (tmp_path / "out").exists()
    # Negative control: the same rope settings in both spellings convert.
    config["rope_scaling"] = {"type": "default", "rope_theta": 500000.0}
    (folder / "config.json").write_text(json.dumps(config))
    rc, _, err = convert(capsys, "--from-hf", str(folder), "--out", str(out_file))
    assert (rc, err) == (0, "")


def test_model_safetensors_beside_a_shard_index_is_read_as_transformers_reads_it(capsys, tmp_path):
    """Shards of one model and model.safetensors of another in one folder: transformers' from_pretrained
    loads model.safetensors, so the conversion is of that file, and says the index was ignored."""
    sharded, single = build("llama3"), build("llama3")
    with torch.no_grad():
        for p in single.parameters():
            p.mul_(0.5)
    folder = save(sharded, tmp_path / "both", max_shard_size="100KB")
    save(single, tmp_path / "single")
    (folder / "model.safetensors").write_bytes((tmp_path / "single" / "model.safetensors").read_bytes())
    assert (folder / "model.safetensors.index.json").is_file()
    loaded = transformers.AutoModelForCausalLM.from_pretrained(folder)
    assert torch.equal(loaded.model.embed_tokens.weight, single.model.embed_tokens.weight)
    rc, out, err = convert(capsys, "--from-hf", str(folder), "--out", str(tmp_path / "both.bin"))
    assert (rc, err) == (0, "")
    assert printed(out, "from") == f"{folder} (model_type llama; one file, fp32)"
    assert printed(out, "conversion") == ("model.safetensors read and model.safetensors.index.json beside it "
                                          "ignored, as transformers' from_pretrained does")
    assert convert(capsys, "--from-hf", str(tmp_path / "single"), "--out", str(tmp_path / "single.bin"))[0] == 0
    assert sha256_file(tmp_path / "both.bin") == sha256_file(tmp_path / "single.bin")


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_non_finite_weights_are_refused(capsys, tmp_path, llama_folder, bad):
    """transformers loads them; lockstep run would refuse the converted file, so convert refuses first."""
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(llama_folder, folder)
    weights = folder / "model.safetensors"
    tensors = safetensors_numpy.load_file(str(weights))
    tensors["model.layers.1.self_attn.o_proj.weight"][3, :2] = float(bad)
    safetensors_numpy.save_file(tensors, str(weights), metadata={"format": "pt"})
    out_file = tmp_path / "out" / "model.bin"
    rc, out, err = convert(capsys, "--from-hf", str(folder), "--out", str(out_file))
    counts = "2 NaN and 0 infinite" if bad == "nan" else "0 NaN and 2 infinite"
    assert (rc, out) == (1, "")
    assert err == (f"lockstep: error: {weights}: tensor model.layers.1.self_attn.o_proj.weight holds {counts} "
                   "value(s); lockstep run refuses such weights, so they are not converted\n")
    assert not out_file.exists() and list((tmp_path / "out").iterdir() if (tmp_path / "out").exists() else []) == []


@pytest.mark.parametrize("where", ["model.safetensors", "config.json", "hard link", "symlink", "index"])
def test_out_that_is_one_of_the_inputs_is_refused_even_with_force(capsys, tmp_path, llama_folder, where):
    """`--out DIR/model.safetensors` once replaced the user's Hugging Face weights with the LLMC file, exit 0."""
    import os
    import shutil

    folder = tmp_path / "hf"
    shutil.copytree(llama_folder, folder)
    weights = folder / "model.safetensors"
    before = sha256_file(weights)
    if where == "hard link":
        out_file = tmp_path / "elsewhere.bin"
        os.link(weights, out_file)
    elif where == "symlink":
        out_file = tmp_path / "link.bin"
        out_file.symlink_to(weights)
    elif where == "index":
        out_file = folder / "model.safetensors.index.json"  # not there, but transformers would read it
    else:
        out_file = folder / where
    for extra in ([], ["--force"]):
        rc, out, err = convert(capsys, "--from-hf", str(folder), "--out", str(out_file), *extra)
        assert (rc, out) == (1, "") and len(err.splitlines()) == 1, err
        if where == "index":
            assert err == (f"lockstep: error: {out_file}: is where transformers reads the checkpoint's "
                           f"model.safetensors.index.json in {folder}; an LLMC file there would break that folder: "
                           "choose another --out\n")
        else:
            own = "config.json" if where == "config.json" else "model.safetensors"
            assert err == (f"lockstep: error: {out_file}: is the checkpoint's own {own} ({folder / own}), an input "
                           "of this conversion; writing the LLMC file there would replace it: choose another --out\n")
    assert sha256_file(weights) == before
    assert sorted(p.name for p in folder.iterdir()) == sorted(p.name for p in llama_folder.iterdir())


def test_a_file_lockstep_did_not_write_is_refused_unless_force_moves_it_aside(capsys, tmp_path, llama_folder):
    out_file = tmp_path / "model.bin"
    out_file.write_text("my notes\n")
    rc, out, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))
    assert (rc, out) == (1, "")
    assert err == (f"lockstep: error: {out_file}: exists and is not an LLMC checkpoint, so lockstep did not write it; "
                   "choose another --out, or pass --force to move it aside (nothing is deleted)\n")
    assert out_file.read_text() == "my notes\n"
    rc, out, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file), "--force")
    assert (rc, err) == (0, "")
    aside = next(tmp_path.glob("model.bin.moved-by-lockstep-*"))
    assert aside.read_text() == "my notes\n"
    assert out.splitlines()[1] == f"  moved aside {out_file} (not an LLMC checkpoint, --force) -> {aside}"
    # An LLMC checkpoint at --out is what convert writes: replaced without --force, nothing moved.
    first = sha256_file(out_file)
    rc, out, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))
    assert (rc, err) == (0, "") and "moved aside" not in out and sha256_file(out_file) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model.bin", aside.name])


@pytest.fixture(scope="module")
def large_llama_folder(tmp_path_factory):
    """A Llama 3 whose LLMC file is ~70 MB: its write lasts long enough to be killed half-way."""
    model = build("llama3", vocab_size=32000, hidden_size=256, intermediate_size=768, num_attention_heads=4)
    return save(model, tmp_path_factory.mktemp("large") / "hf")


def test_a_conversion_killed_mid_write_leaves_a_temporary_that_the_next_one_removes(capsys, tmp_path,
                                                                                    large_llama_folder):
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out_file = tmp_path / "large.bin"
    src = Path(__file__).resolve().parents[2] / "src"
    proc = subprocess.Popen([sys.executable, "-m", "lockstep", "convert", "--from-hf", str(large_llama_folder),
                             "--out", str(out_file)], env={**os.environ, "PYTHONPATH": str(src)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    temps = []
    try:
        deadline = time.monotonic() + 120
        while not temps and proc.poll() is None and time.monotonic() < deadline:
            temps = [p for p in tmp_path.glob(".large.bin.*tmp") if p.stat().st_size > 0]
            time.sleep(0.002)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and temps, "the conversion ended before it could be killed mid-write"
    assert not out_file.exists() and [p.name for p in tmp_path.iterdir()] == [temps[0].name]
    assert f"-{proc.pid}-" in temps[0].name  # whose it is: the process that was killed

    rc, out, err = convert(capsys, "--from-hf", str(large_llama_folder), "--out", str(out_file))
    assert (rc, err) == (0, "")
    removed = out.splitlines()[1]
    assert removed.startswith(f"  removed     {temps[0]} (") and removed.endswith(
        f"), left by lockstep process {proc.pid}, which ended mid-write")
    assert [p.name for p in tmp_path.iterdir()] == ["large.bin"]
    assert printed(out, "bytes") == f"{out_file.stat().st_size:,}"


def doc_demo_block(doc) -> str:
    """The bash block after the `cpu-demo` marker of docs/reference/hf-convert.md, as the reader sees it."""
    text = doc.read_text()
    after = text[text.index("<!-- cpu-demo:"):]
    start = after.index("```bash\n") + len("```bash\n")
    return after[start:after.index("\n```", start) + 1]


def test_the_docs_cpu_demo_runs_as_written(tmp_path):
    """docs/reference/hf-convert.md's offline demo, run as its bash block says (python and lockstep
    on PATH, offline): a tiny random GPT-2 saved by transformers, converted, trained on two frameworks."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = doc_demo_block(root / "docs" / "reference" / "hf-convert.md")
    assert "save_pretrained(\"tiny-gpt2\")" in script and "lockstep convert --from-hf tiny-gpt2" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, command in (("python", f'exec {sys.executable} "$@"'), ("lockstep", f'exec {sys.executable} -m lockstep "$@"')):
        (bin_dir / name).write_text(f"#!/bin/sh\n{command}\n")
        (bin_dir / name).chmod(0o755)
    work = tmp_path / "demo"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(root / "src"),
           "LOCKSTEP_OFFLINE": "1", "LOCKSTEP_HISTORY": str(tmp_path / "history.sqlite")}
    done = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "model       gpt2: L=2 NH=12 C=96 V=50257 Vp=50304 maxT=1024" in done.stdout
    assert "PASS: 1 PASS" in done.stdout
    record = read_run_record(work / "demo-run" / "megatron" / "gpt2_1.jsonl")
    assert len(record.losses()) == 3 and abs(record.losses()[0] - np.log(50257)) < 0.1  # a random model's start
    assert record.meta["checkpoint_sha256"] == sha256_file(work / "tiny-gpt2.bin")  # trained from what convert wrote


@pytest.mark.parametrize("what", ["missing", "file"])
def test_from_infinitrain_says_what_the_path_is_when_it_is_no_folder(capsys, tmp_path, what):
    source = tmp_path / "checkpoint_step_000010"
    if what == "file":
        source.write_bytes(b"not a folder")
    rc, out, err = convert(capsys, "--from-infinitrain", str(source), "--out", str(tmp_path / "x.bin"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and str(source) in err and "is a directory" not in err
    assert ("no such directory" if what == "missing" else "is a file, not a folder") in err
    assert not (tmp_path / "x.bin").exists()
