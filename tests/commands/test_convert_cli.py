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
    out_file.write_bytes(b"previous")
    real_read = HFCheckpoint.read

    def failing_read(self, name):
        if name == "model.layers.1.mlp.down_proj.weight":
            raise FormatError(self.directory / "model.safetensors", f"tensor {name} cannot be read")
        return real_read(self, name)

    monkeypatch.setattr(HFCheckpoint, "read", failing_read)
    rc, _, err = convert(capsys, "--from-hf", str(llama_folder), "--out", str(out_file))
    assert rc == 1 and "cannot be read" in err
    assert out_file.read_bytes() == b"previous"
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
    assert rc == 1 and "FAIL: nothing was compared: pytorch ran alone" in out, err  # trained, compared with nothing
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
