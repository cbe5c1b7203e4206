"""Hugging Face checkpoints -> LLMC (`models/<family>/hf.py`, `models/hf_convert.py`).

On tiny random models that transformers builds and saves here: the converted file in lockstep's
reference gives transformers' logits to 1e-5 for each family, tied and untied heads; a wrong q/k
permutation (the negative control) does not; sharded, bf16 and fp16 checkpoints convert to the
values they hold; LLMC -> HF names -> LLMC is bit-exact; and the header values llm.c's readers
need (Vp, Llama 3's ffn_dim_multiplier/multiple_of, use_scaled_rope) are the right ones.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from lockstep.errors import FormatError
from lockstep.fsutil import sha256_file
from lockstep.models import FAMILIES, SHAPES, load_checkpoint
from lockstep.models.family import HFOptions
from lockstep.models.hf_convert import convert_hf_checkpoint
from lockstep.models.llama3 import hf as llama3_hf
from lockstep.models.llama3.config import llama3_ffn_hidden

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")
safetensors_numpy = pytest.importorskip("safetensors.numpy")

from support.hf_models import build, hf_logits, save, token_batch  # noqa: E402

LOGITS_LIMIT = 1e-5  # FP32, the contract's loss threshold (issue 24)
VARIANTS = {"gpt2": ("gpt2", {}), "llama3": ("llama3", {}), "llama3-tied": ("llama3", {"tie_word_embeddings": True}),
            "qwen3": ("qwen3", {}), "qwen3-tied": ("qwen3", {"tie_word_embeddings": True})}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """variant -> (transformers model, its saved folder), built once per module."""
    cache = {}

    def get(variant: str):
        if variant not in cache:
            kind, overrides = VARIANTS[variant]
            model = build(kind, **overrides)
            cache[variant] = (model, save(model, tmp_path_factory.mktemp(variant) / "hf"))
        return cache[variant]

    return get


def reference_logits(path, tokens) -> np.ndarray:
    ckpt = load_checkpoint(path)
    model = FAMILIES[ckpt.family].reference_class().from_llmc(ckpt.tensors, ckpt.config).eval()
    with torch.no_grad():
        logits, _ = model(torch.as_tensor(tokens))
    return logits.numpy()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_converted_file_gives_transformers_logits(saved, tmp_path, variant):
    model, folder = saved(variant)
    out = tmp_path / "model.bin"
    done = convert_hf_checkpoint(folder, out)
    assert done.family.name == VARIANTS[variant][0]
    tokens = token_batch(model.config.vocab_size)
    expected = hf_logits(model, tokens)
    got = reference_logits(out, tokens)
    assert got.shape == expected.shape
    assert np.abs(got - expected).max() <= LOGITS_LIMIT, np.abs(got - expected).max()
    ckpt = load_checkpoint(out)
    if done.family.name != "gpt2":
        same = np.array_equal(ckpt.tensors["lm_head"], ckpt.tensors["wte"])
        assert same == variant.endswith("-tied")  # a tied checkpoint's embedding is written as the head too


def test_wrong_qk_permutation_is_caught_by_the_logits(saved, tmp_path, monkeypatch):
    """Negative control: without un-permuting q/k the Llama 3 file rotates the wrong pairs, and
    the logits test above must see it (far beyond 1e-5, though the loss barely moves)."""
    model, folder = saved("llama3")
    monkeypatch.setattr(llama3_hf, "hf_to_interleaved", lambda w, heads: w)
    convert_hf_checkpoint(folder, tmp_path / "wrong.bin")
    tokens = token_batch(model.config.vocab_size)
    gap = np.abs(reference_logits(tmp_path / "wrong.bin", tokens) - hf_logits(model, tokens)).max()
    assert gap > 100 * LOGITS_LIMIT, gap


def test_gpt2_layout_is_llm_c_s(saved, tmp_path):
    """Vp = V rounded up to 128 with zero rows; Conv1D weights transposed; header words as llm.c writes them."""
    model, folder = saved("gpt2")
    out = tmp_path / "gpt2.bin"
    convert_hf_checkpoint(folder, out)
    header = np.fromfile(out, dtype="<i4", count=8)
    assert header.tolist() == [20240326, 3, 64, 300, 2, 12, 48, 384]
    ckpt = load_checkpoint(out)
    sd = {k: v.numpy() for k, v in model.state_dict().items()}
    assert np.array_equal(ckpt.tensors["wte"][:300], sd["transformer.wte.weight"])
    assert not ckpt.tensors["wte"][300:].any()
    assert np.array_equal(ckpt.tensors["qkvw"][1], sd["transformer.h.1.attn.c_attn.weight"].T)
    assert np.array_equal(ckpt.tensors["fcprojw"][0], sd["transformer.h.0.mlp.c_proj.weight"].T)


def test_gpt2_hub_layout_converts_to_the_same_bytes(saved, tmp_path):
    """openai-community/gpt2's model.safetensors names tensors without `transformer.` and keeps each
    block's causal-mask buffer (`h.N.attn.bias`): the same weights, the same file."""
    _, folder = saved("gpt2")
    tensors = safetensors_numpy.load_file(str(folder / "model.safetensors"))
    hub = {name.removeprefix("transformer."): t for name, t in tensors.items()}
    hub |= {f"h.{i}.attn.bias": np.tril(np.ones((1, 1, 64, 64), np.float32)) for i in range(2)}
    hub_folder = tmp_path / "hub"
    hub_folder.mkdir()
    safetensors_numpy.save_file(hub, str(hub_folder / "model.safetensors"))
    (hub_folder / "config.json").write_text((folder / "config.json").read_text())
    convert_hf_checkpoint(folder, tmp_path / "saved.bin")
    convert_hf_checkpoint(hub_folder, tmp_path / "hub.bin")
    assert sha256_file(tmp_path / "hub.bin") == sha256_file(tmp_path / "saved.bin")



def _gpt2_with_head(saved, folder, head_of) -> None:
    """The saved GPT-2 with an lm_head.weight stored beside wte: head_of(wte) -> the head."""
    _, source = saved("gpt2")
    tensors = safetensors_numpy.load_file(str(source / "model.safetensors"))
    tensors["lm_head.weight"] = head_of(tensors["transformer.wte.weight"])
    folder.mkdir()
    safetensors_numpy.save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text((source / "config.json").read_text())


def test_an_untied_gpt2_head_is_refused_with_its_difference(saved, tmp_path):
    def nudged(wte):
        head = wte.copy()
        head[7, 3] += 0.25
        return head

    _gpt2_with_head(saved, tmp_path / "untied", nudged)
    with pytest.raises(FormatError) as refused:
        convert_hf_checkpoint(tmp_path / "untied", tmp_path / "out.bin")
    message = str(refused.value)
    assert str(tmp_path / "untied" / "model.safetensors") in message
    assert "untied lm_head.weight that differs from transformer.wte.weight by up to 0.25" in message
    assert "drop it" in message and not (tmp_path / "out.bin").exists()


def test_a_gpt2_head_equal_to_wte_converts_to_the_same_bytes(saved, tmp_path):
    _, folder = saved("gpt2")
    _gpt2_with_head(saved, tmp_path / "tied", lambda wte: wte.copy())
    convert_hf_checkpoint(folder, tmp_path / "saved.bin")
    convert_hf_checkpoint(tmp_path / "tied", tmp_path / "tied.bin")
    assert sha256_file(tmp_path / "tied.bin") == sha256_file(tmp_path / "saved.bin")


def test_sharded_checkpoint_converts_to_the_same_bytes(saved, tmp_path):
    model, folder = saved("llama3")
    sharded = save(model, tmp_path / "sharded", max_shard_size="100KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1 and (sharded / "model.safetensors.index.json").is_file()
    done = convert_hf_checkpoint(sharded, tmp_path / "from_shards.bin")
    assert done.shards > 1
    convert_hf_checkpoint(folder, tmp_path / "from_one.bin")
    assert sha256_file(tmp_path / "from_shards.bin") == sha256_file(tmp_path / "from_one.bin")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoint_is_widened_exactly(tmp_path, dtype):
    model = build("qwen3").to(getattr(torch, dtype))
    folder = save(model, tmp_path / "hf")
    done = convert_hf_checkpoint(folder, tmp_path / "q.bin")
    assert done.source_dtypes == ({"bfloat16": "BF16", "float16": "F16"}[dtype],)
    ckpt = load_checkpoint(tmp_path / "q.bin")
    sd = {k: v.float().numpy() for k, v in model.state_dict().items()}
    assert np.array_equal(ckpt.tensors["qkvw"][0], np.concatenate(
        [sd[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv"]))
    assert np.array_equal(ckpt.tensors["qknormw"][1][1], sd["model.layers.1.self_attn.k_norm.weight"])


@pytest.mark.parametrize("variant", ["gpt2", "llama3", "qwen3"])
def test_llmc_to_hf_names_and_back_is_bit_exact(saved, tmp_path, variant):
    """LLMC -> HF state dict + config.json (the adapter's other direction) -> LLMC: the same sha256;
    transformers loads the HF side and gives the same logits as the model it came from."""
    model, folder = saved(variant)
    first = tmp_path / "first.bin"
    convert_hf_checkpoint(folder, first)
    ckpt = load_checkpoint(first)
    adapter = FAMILIES[ckpt.family].hf
    back = tmp_path / "hf_back"
    back.mkdir()
    safetensors_numpy.save_file(adapter.to_hf(ckpt.config, ckpt.tensors), str(back / "model.safetensors"))
    (back / "config.json").write_text(json.dumps(adapter.hf_config(ckpt.config)))
    second = tmp_path / "second.bin"
    convert_hf_checkpoint(back, second)
    assert sha256_file(second) == sha256_file(first)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(back, attn_implementation="eager").eval()
    tokens = token_batch(model.config.vocab_size)
    assert np.abs(hf_logits(reloaded, tokens) - hf_logits(model, tokens)).max() <= LOGITS_LIMIT


def test_registered_shapes_round_trip_their_headers():
    """LLMC -> HF config.json -> LLMC keeps every registered shape's header (Llama 3's multiplier pair included)."""
    for shape in SHAPES.values():
        adapter = FAMILIES[shape.family].hf
        back = adapter.read_config(adapter.hf_config(shape.config), "config.json", HFOptions()).config
        assert back == shape.config, shape.name


LLAMA_32_SCALING = {"rope_type": "llama3", "factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                    "original_max_position_embeddings": 8192}


# The fields of the Hub's config.json of the seed's models (transformers 4.x spelling).
QWEN3_COMMON = {"model_type": "qwen3", "hidden_act": "silu", "attention_bias": False, "use_sliding_window": False,
                "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
                "rope_theta": 1000000, "rope_scaling": None, "num_key_value_heads": 8}
HUB_CONFIGS = {
    "qwen3-1.7b": QWEN3_COMMON | {"hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
                                  "num_attention_heads": 16, "tie_word_embeddings": True},
    "qwen3-8b": QWEN3_COMMON | {"hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
                                "num_attention_heads": 32, "tie_word_embeddings": False},
    "llama3": {"model_type": "llama", "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "head_dim": 64,
               "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
               "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": True,
               "rope_scaling": LLAMA_32_SCALING},
}


@pytest.mark.parametrize("shape", list(HUB_CONFIGS))
def test_hub_configs_of_the_seed_s_models_give_the_registered_shapes(shape):
    """Qwen3-1.7B, Qwen3-8B and Llama 3.2 1B (with --no-rope-scaling; its maxT is the Hub's 131072)."""
    fam = FAMILIES[SHAPES[shape].family]
    model = fam.hf.read_config(HUB_CONFIGS[shape], "config.json", HFOptions(drop_rope_scaling=True))
    expected = SHAPES[shape].config
    if shape == "llama3":
        assert model.config.max_seq_len == 131072
        assert {k: v for k, v in model.config.to_dict().items() if k != "max_seq_len"} == \
            {k: v for k, v in expected.to_dict().items() if k != "max_seq_len"}
    else:
        assert model.config == expected
    assert model.tied == HUB_CONFIGS[shape]["tie_word_embeddings"]


@pytest.mark.parametrize("channels, intermediate, expected", [
    (2048, 8192, (1.5, 256)),  # Llama 3.2 1B (Meta's params.json)
    (3072, 8192, (1.0, 256)),  # Llama 3.2 3B
    (4096, 14336, (1.3, 1024)),  # Llama 3.1 8B
    (8192, 28672, (1.3, 4096)),  # Llama 3.1 70B
    (128, 512, (1.5, 256)),  # llama3-tiny
])
def test_ffn_header_is_meta_s_pair_where_one_fits(channels, intermediate, expected):
    assert llama3_hf.ffn_header(channels, intermediate) == expected


@pytest.mark.parametrize("channels, intermediate", [(64, 192), (64, 100), (96, 257), (4096, 11008), (2048, 5632)])
def test_ffn_header_reproduces_any_other_intermediate_size(channels, intermediate):
    multiplier, multiple_of = llama3_hf.ffn_header(channels, intermediate)
    assert llama3_ffn_hidden(channels, multiplier, multiple_of) == intermediate
    assert np.float32(multiplier) == multiplier  # what the float32 header word holds


def llama_config_json(**changes) -> dict:
    cfg = llama3_hf.hf_config(SHAPES["llama3"].config)
    return cfg | changes


@pytest.mark.parametrize("spelling", ["rope_scaling", "rope_parameters"])
def test_llama_rope_scaling_sets_use_scaled_rope_which_run_refuses(spelling):
    if spelling == "rope_scaling":
        cfg = llama_config_json(rope_scaling=LLAMA_32_SCALING)
    else:  # transformers 5's config.json
        cfg = {k: v for k, v in llama_config_json().items() if k not in ("rope_theta", "rope_scaling")}
        cfg["rope_parameters"] = {"rope_theta": 500000.0} | LLAMA_32_SCALING
    model = llama3_hf.read_config(cfg, "config.json", HFOptions())
    assert model.config.use_scaled_rope and model.config.rope_theta == 500000.0
    assert model.config.training_problems() == [
        "use_scaled_rope is 1 (Llama 3.1 RoPE scaling), which lockstep's frameworks do not implement; convert "
        "with `lockstep convert --no-rope-scaling` to train it with plain RoPE"]
    dropped = llama3_hf.read_config(cfg, "config.json", HFOptions(drop_rope_scaling=True)).config
    assert not dropped.use_scaled_rope and dropped.training_problems() == []
    assert (dropped.ffn_dim_multiplier, dropped.multiple_of) == (1.5, 256)


@pytest.mark.parametrize("family_name, changes, problem", [
    ("llama3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling of type 'yarn' has no LLMC form"),
    ("llama3", {"attention_bias": True}, "attention_bias is True; the LLMC Llama 3 format (no biases) needs False"),
    ("llama3", {"head_dim": 128, "hidden_size": 1024},
     "head_dim is 128 but hidden_size/num_attention_heads is 1024/32 = 32"),
    ("qwen3", {"head_dim": 128, "hidden_size": 1024, "num_attention_heads": 16},  # Qwen3-0.6B
     "head_dim is 128 but hidden_size/num_attention_heads is 1024/16 = 64; the LLMC format derives head_dim as C/NH"),
    ("qwen3", {"use_sliding_window": True}, "use_sliding_window is True"),
    ("gpt2", {"n_inner": 100}, "n_inner is 100; the LLMC GPT-2 format holds an MLP of 4*n_embd"),
    ("gpt2", {"activation_function": "relu"}, "activation_function is 'relu'"),
    ("gpt2", {"tie_word_embeddings": False}, "tie_word_embeddings is False"),
    ("gpt2", {"n_layer": "12"}, "n_layer is '12', not an integer"),
])
def test_configs_without_an_llmc_form_are_refused(family_name, changes, problem):
    adapter = FAMILIES[family_name].hf
    shape = {"gpt2": "gpt2", "llama3": "llama3", "qwen3": "qwen3-1.7b"}[family_name]
    cfg = adapter.hf_config(SHAPES[shape].config) | changes
    with pytest.raises(FormatError, match="^config.json: ") as e:
        adapter.read_config(cfg, "config.json", HFOptions())
    assert problem in str(e.value)
