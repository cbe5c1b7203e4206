"""The Mixtral family: InfiniTrain tiny_mixtral's LLMC v2 file, the reference MoE, and Hugging Face parity.

Exact header words, tensor order and file size, a byte-exact write/read round trip, the golden
sha256 of `lockstep init-checkpoint --model mixtral-tiny`, header errors in one sentence; a tiny
random `MixtralForCausalLM` converted with `lockstep convert --from-hf` gives transformers'
logits, router logits and chosen experts (FP32, <= 1e-5); the aux loss equals megatron-core's
`switch_load_balancing_loss_func` and, where the two contracts agree (one layer), transformers'
`load_balancing_loss_func` times top-k. Negative controls: a router that does not renormalise,
ties broken towards the higher index, an aux loss scaled by 2 - each fails its comparison.
"""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

from lockstep.cli import main
from lockstep.errors import FormatError
from lockstep.fsutil import sha256_file
from lockstep.models import FAMILIES, SHAPES, load_checkpoint
from lockstep.models.mixtral import model as reference
from lockstep.models.mixtral.config import MixtralConfig

pytestmark = pytest.mark.integration  # trains a real framework (tests/README.md: the lanes)

torch = pytest.importorskip("torch")

FAMILY = FAMILIES["mixtral"]
TINY = SHAPES["mixtral-tiny"].config
# `lockstep init-checkpoint --model mixtral-tiny` (seed 42, pcg64-polar-v1); change on purpose only.
GOLDEN_TINY_SEED42 = "1f6a080eab5293491f29a756742ea312f61b66378881035ec9f014e26ed8d63c"
SMALL = MixtralConfig(max_seq_len=32, vocab_size=96, num_layers=2, num_heads=4, num_kv_heads=1, channels=32,
                      num_experts=4, router_topk=2, moe_ffn_hidden_size=40)
LIMIT = 1e-5  # FP32, the contract's threshold


def f32_bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", x))[0]


def expected_shapes(c: MixtralConfig) -> list[tuple[str, tuple[int, ...]]]:
    """checkpoint_loader.cc's read order, written out here, not taken from the config."""
    C, F, hd = c.channels, c.moe_ffn_hidden_size, c.channels // c.num_heads
    out = [("wte", (c.vocab_size, C))]
    for l in range(c.num_layers):
        out += [(f"ln1w[{l}]", (C,)), (f"qkvw[{l}]", ((c.num_heads + 2 * c.num_kv_heads) * hd, C)),
                (f"attprojw[{l}]", (C, C)), (f"ln2w[{l}]", (C,)), (f"routerw[{l}]", (c.num_experts, C))]
        for e in range(c.num_experts):
            out += [(f"expert{e}.fcw2[{l}]", (F, C)), (f"expert{e}.fcw[{l}]", (F, C)), (f"expert{e}.fcprojw[{l}]", (C, F))]
    return out + [("lnfw", (C,)), ("lm_head", (c.vocab_size, C))]


def header_words(c: MixtralConfig) -> list[int]:
    return [20260513, 2, c.max_seq_len, c.vocab_size, c.num_layers, c.num_heads, c.num_kv_heads, c.channels,
            c.num_experts, f32_bits(c.ffn_expansion_ratio), 0, 0, f32_bits(c.norm_eps), f32_bits(c.rope_theta), 0,
            c.router_topk, c.moe_ffn_hidden_size]


@pytest.fixture(scope="module")
def tiny_init(tmp_path_factory):
    path = tmp_path_factory.mktemp("mixtral") / "mixtral_tiny.bin"
    assert main(["init-checkpoint", "--model", "mixtral-tiny", "--out", str(path)]) == 0
    return path


def test_tiny_header_words_and_size(tiny_init):
    words = np.fromfile(tiny_init, dtype="<i4", count=256)
    assert words[:17].tolist() == [20260513, 2, 1024, 128256, 2, 4, 1, 64, 8, f32_bits(3.5), 0, 0, f32_bits(1e-5),
                                   f32_bits(1e6), 0, 2, 224]
    assert not words[17:].any()
    assert expected_shapes(TINY) == TINY.tensor_shapes()
    n = sum(math.prod(s) for _, s in expected_shapes(TINY))
    assert n == 17_126_720
    assert tiny_init.stat().st_size == 1024 + 4 * n == 68_507_904


def test_tiny_mixtral_s_own_shape_is_its_config_h():
    c = SHAPES["mixtral-l32-c512"].config
    assert header_words(c) == [20260513, 2, 32768, 128256, 32, 4, 1, 512, 8, f32_bits(3.5), 0, 0, f32_bits(1e-5),
                               f32_bits(1e6), 0, 2, 1792]
    # active parameters: 2 of 8 experts per layer (plus the router and attention), wte not counted
    per_layer_active = 512 + 768 * 512 + 512 * 512 + 512 + 8 * 512 + 2 * 3 * 512 * 1792
    assert c.matmul_parameters() == 32 * per_layer_active + 512 + 128256 * 512


def test_init_checkpoint_golden_sha256(tiny_init):
    assert sha256_file(tiny_init) == GOLDEN_TINY_SEED42


def test_init_rule_holds_tensor_by_tensor(tiny_init):
    """Matrices N(0, 0.02) (routers too), attention output and every expert's down N(0, 0.02/sqrt(2L)), RMSNorm 1."""
    from test_llama3 import check_init

    ckpt = load_checkpoint(tiny_init)
    residual = 0.02 / math.sqrt(2 * TINY.num_layers)

    def want(name: str):
        if name == "lnfw" or name.startswith(("ln1w", "ln2w")):
            return "ones"
        return residual if name.startswith("attprojw") or ".fcprojw" in name else 0.02

    rule = {name: want(name) for name, _ in expected_shapes(TINY)}
    assert list(ckpt.tensors) == list(rule)
    check_init(ckpt.tensors, rule, per_layer=set())


def test_write_read_round_trip_is_byte_exact(tmp_path):
    rng = np.random.default_rng(11)
    tensors = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in expected_shapes(SMALL)}
    path = tmp_path / "small.bin"
    FAMILY.write(path, SMALL, tensors)
    raw = path.read_bytes()
    assert np.frombuffer(raw[:1024], "<i4").tolist() == header_words(SMALL) + [0] * (256 - 17)
    assert raw[1024:] == b"".join(tensors[name].astype("<f4").tobytes() for name, _ in expected_shapes(SMALL))
    back = load_checkpoint(path)
    assert back.family == "mixtral" and back.version == 2 and back.config == SMALL
    for name, t in tensors.items():
        np.testing.assert_array_equal(back.tensors[name], t)
    again = tmp_path / "again.bin"
    FAMILY.write(again, back.config, back.tensors)
    assert again.read_bytes() == raw


def one_sentence(e: pytest.ExceptionInfo, path) -> str:
    text = str(e.value)
    assert text.startswith(f"{path}: ") and "\n" not in text
    return text[len(f"{path}: "):]


@pytest.mark.parametrize("word,value,message", [
    (0, 20240803, "wrong magic number 20240803 for a Mixtral checkpoint (expected 20260513)"),
    (1, 1, "unsupported Mixtral checkpoint version 1 (supported: 2 = fp32, InfiniTrain's tiny_mixtral layout)"),
    (14, 1, "use_scaled_rope (header word 14) is 1; tiny_mixtral trains with plain RoPE only and refuses a scaled one"),
    (15, 9, "header fields disagree: router top-k 9 is more than the 8 experts"),
    (6, 3, "header fields disagree: heads NH=4 is not divisible by kv heads 3"),
])
def test_bad_headers_are_refused_in_one_sentence(tiny_init, tmp_path, word, value, message):
    raw = bytearray(tiny_init.read_bytes())
    raw[4 * word:4 * word + 4] = struct.pack("<i", value)
    bad = tmp_path / "bad.bin"
    bad.write_bytes(bytes(raw))
    with pytest.raises(FormatError) as e:
        FAMILY.load(bad)
    assert one_sentence(e, bad) == message
    if word:  # (a Llama 3 magic makes `inspect` read it as a broken Llama 3 file)
        assert main(["inspect", str(bad)]) == 1


def test_sizes_must_match_exactly(tiny_init, tmp_path):
    raw = tiny_init.read_bytes()
    for what, data, message in [("short", raw[:-4], "truncated: 68507900 bytes, but the header"),
                                ("long", raw + b"\0" * 4, "4 trailing bytes after the last tensor")]:
        bad = tmp_path / f"{what}.bin"
        bad.write_bytes(data)
        with pytest.raises(FormatError) as e:
            FAMILY.load(bad)
        assert one_sentence(e, bad).startswith(message)


# ---------------------------------------------------------------------------------------------
# Hugging Face parity


transformers = pytest.importorskip("transformers")
HF_FIELDS = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=1, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=128,
                 rope_theta=1000000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0)


def build_hf(**overrides):
    config = transformers.MixtralConfig(**(HF_FIELDS | overrides))
    config._attn_implementation = "eager"
    torch.manual_seed(1234)
    model = transformers.MixtralForCausalLM(config).eval()
    with torch.no_grad():  # the default init's 0.02 router gives near-uniform routing; spread it out
        for layer in model.model.layers:
            layer.mlp.gate.weight.normal_(0.0, 0.5)
    return model


def tokens(vocab: int = 256) -> np.ndarray:
    return np.random.default_rng(1234).integers(0, vocab, size=(2, 24), dtype=np.int64)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(transformers model, the LLMC file `lockstep convert --from-hf` wrote from its save_pretrained folder)."""
    model = build_hf()
    folder = tmp_path_factory.mktemp("hf") / "mixtral"
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    model.save_pretrained(folder)
    out = folder.parent / "mixtral.bin"
    assert main(["convert", "--from-hf", str(folder), "--out", str(out)]) == 0
    return model, out


def hf_run(model, ids: np.ndarray):
    with torch.no_grad():
        out = model(torch.as_tensor(ids), output_router_logits=True)
    return out.logits.numpy(), [r.numpy() for r in out.router_logits]


def reference_run(path, ids: np.ndarray, patch=None):
    ckpt = load_checkpoint(path)
    model = reference.Mixtral.from_llmc(ckpt.tensors, ckpt.config).eval()
    if patch:
        patch(model)
    routings: list[reference.Routing] = []
    with torch.no_grad():
        logits, _ = model(torch.as_tensor(ids), routings=routings)
    return model, logits.numpy(), routings


def test_convert_from_hf_gives_transformers_logits_and_routing(converted):
    model, path = converted
    ckpt = load_checkpoint(path)
    assert ckpt.family == "mixtral" and ckpt.config.num_experts == 8 and ckpt.config.router_topk == 2
    assert ckpt.config.moe_ffn_hidden_size == 96 and ckpt.config.ffn_expansion_ratio == 1.5
    ids = tokens()
    hf_logits, hf_router = hf_run(model, ids)
    _, logits, routings = reference_run(path, ids)
    assert np.abs(logits - hf_logits).max() <= LIMIT, np.abs(logits - hf_logits).max()
    for layer, (ours, theirs) in enumerate(zip(routings, hf_router)):
        assert np.abs(ours.logits.numpy() - theirs).max() <= LIMIT, layer
        # transformers' choice: top-k of the full softmax; ours: top-k of the logits, the same experts in the same order
        hf_experts = torch.topk(torch.softmax(torch.as_tensor(theirs), -1), 2, dim=-1).indices.numpy()
        np.testing.assert_array_equal(ours.experts.numpy(), hf_experts)
        assert len(np.unique(ours.experts.numpy())) == 8  # every expert serves some token: the test sees them all


def test_llmc_to_hf_and_back_is_bit_exact(converted, tmp_path):
    """LLMC -> HF (Hub per-expert names) + config.json -> LLMC is the same sha256; transformers loads it."""
    safetensors_numpy = pytest.importorskip("safetensors.numpy")
    model, first = converted
    ckpt = load_checkpoint(first)
    back = tmp_path / "hf_back"
    back.mkdir()
    safetensors_numpy.save_file(FAMILY.hf.to_hf(ckpt.config, ckpt.tensors), str(back / "model.safetensors"))
    (back / "config.json").write_text(json.dumps(FAMILY.hf.hf_config(ckpt.config)))
    second = tmp_path / "second.bin"
    assert main(["convert", "--from-hf", str(back), "--out", str(second)]) == 0
    assert sha256_file(second) == sha256_file(first)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(back, attn_implementation="eager").eval()
    ids = tokens()
    assert np.abs(hf_run(reloaded, ids)[0] - hf_run(model, ids)[0]).max() <= LIMIT


def test_router_without_renormalisation_is_caught_by_the_logits(converted):
    """Negative control: weights = the full softmax's top-k probabilities, not renormalised over the k."""
    model, path = converted

    def unnormalised(logits, k):
        experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :k]
        return experts, torch.softmax(logits, dim=-1).gather(-1, experts)

    def patch(m):
        for blk in m.h:
            blk.mlp.route = unnormalised

    ids = tokens()
    _, logits, _ = reference_run(path, ids, patch)
    gap = np.abs(logits - hf_run(model, ids)[0]).max()
    assert gap > 100 * LIMIT, gap


def test_ties_go_to_the_lower_expert_index_and_the_reverse_is_caught(converted):
    """InfiniTrain's top-k kernels (CPU and CUDA) rank an equal value at a lower index first; the
    reference does too. With every router weight 0 all logits tie: experts 0 and 1, weights 1/2.
    Negative control: ties broken towards the higher index route to 7 and 6 and change the logits."""
    _, path = converted

    def zero_routers(m):
        with torch.no_grad():
            for blk in m.h:
                blk.mlp.router.weight.zero_()

    def reversed_ties(logits, k):
        flipped = logits.flip(-1)
        experts = logits.shape[-1] - 1 - torch.sort(flipped, dim=-1, descending=True, stable=True).indices[:, :k]
        return experts, torch.softmax(logits.gather(-1, experts), dim=-1)

    def reversed_patch(m):
        zero_routers(m)
        for blk in m.h:
            blk.mlp.route = reversed_ties

    ids = tokens()
    _, tied, routings = reference_run(path, ids, zero_routers)
    for r in routings:
        assert (r.experts.numpy() == [0, 1]).all() and (r.weights.numpy() == 0.5).all()
    _, flipped, flipped_routings = reference_run(path, ids, reversed_patch)
    assert (flipped_routings[0].experts.numpy() == [7, 6]).all()
    assert np.abs(tied - flipped).max() > 100 * LIMIT


def hf_aux(router_logits: list[np.ndarray], k: int = 2) -> float:
    from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

    return float(load_balancing_loss_func(tuple(torch.as_tensor(r) for r in router_logits), 8, k))


def megatron_aux(routing: reference.Routing, coeff: float = 1.0) -> float:
    mu = pytest.importorskip("megatron.core.transformer.moe.moe_utils")
    probs = torch.softmax(routing.logits.float(), dim=-1)
    tokens_per_expert = torch.bincount(routing.experts.reshape(-1), minlength=8).float()
    return float(mu.switch_load_balancing_loss_func(probs, tokens_per_expert, probs.shape[0], 2, 8, coeff))


@pytest.mark.parametrize("scale", [1.0, 2.0])
def test_aux_loss_is_megatron_s_and_transformers_where_they_agree(converted, monkeypatch, scale):
    """Per layer the reference's aux loss is megatron-core's switch loss (coefficient 1); with one
    layer transformers' load_balancing_loss_func is top-k times it (HF does not divide the counts
    by k). Over several layers they differ by contract: megatron sums per-layer losses, HF pools
    the layers' tokens first. Negative control (scale 2): an aux loss scaled by 2 fails both."""
    model, path = converted
    if scale != 1.0:
        real = reference.switch_aux_loss
        monkeypatch.setattr(reference, "switch_aux_loss", lambda r, e: scale * real(r, e))
    ids = tokens()
    ref_model, _, routings = reference_run(path, ids)
    _, hf_router = hf_run(model, ids)
    per_layer = [float(reference.switch_aux_loss(r, 8)) for r in routings]
    total = float(ref_model.aux_loss(routings))
    agree_megatron = all(abs(p - megatron_aux(r)) <= 1e-6 for p, r in zip(per_layer, routings))
    agree_hf_one_layer = abs(2 * per_layer[0] - hf_aux(hf_router[:1])) <= 1e-6
    assert math.isclose(total, sum(per_layer), rel_tol=1e-6)
    if scale == 1.0:
        assert agree_megatron and agree_hf_one_layer
        pooled = hf_aux(hf_router)  # the documented difference: pooled over layers, not summed
        assert abs(pooled - 2 * total) > 1e-3 and abs(pooled - total) > 1e-3
    else:
        assert not agree_megatron and not agree_hf_one_layer


def test_training_loss_is_ce_alone_under_the_contract(converted):
    """AUX_LOSS_COEFF is 0 (tiny_mixtral has no aux loss): the model's loss is the mean CE, which is
    what the reference training loop computes from the logits."""
    _, path = converted
    ckpt = load_checkpoint(path)
    model = reference.Mixtral.from_llmc(ckpt.tensors, ckpt.config).eval()
    ids = torch.as_tensor(tokens())
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    with torch.no_grad():
        logits, loss = model(x, y)
        ce = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        assert reference.AUX_LOSS_COEFF == 0.0 and float(loss) == float(ce)
        model.aux_loss_coeff = 0.01  # what a non-zero coefficient would add
        _, with_aux = model(x, y)
    assert float(with_aux) > float(ce)


def test_lockstep_run_trains_it_on_pytorch(tmp_path):
    """`lockstep run --matrix mixtral --frameworks pytorch,pytorch-fast` on a CPU: the reference loop
    trains the family unchanged (coefficient 0: the loss is the CE); step 1's logged loss is the
    reference model's mean CE on the contract's first micro batch, computed here independently; the
    two runs PASS and the step-1 certificate holds over every tensor, each expert's gradients named."""
    from lockstep.cases import load_matrix
    from lockstep.data.loader import TokenBatches
    from lockstep.formats.tokens import read_token_stream, write_token_stream
    from lockstep.models.init import init_tensors

    config = MixtralConfig(max_seq_len=128, vocab_size=256, num_layers=2, num_heads=4, num_kv_heads=1, channels=32,
                           num_experts=8, router_topk=2, moe_ffn_hidden_size=48)
    ckpt_path, data = tmp_path / "mixtral.bin", tmp_path / "tokens.bin"
    FAMILY.write(ckpt_path, config, init_tensors(config, FAMILY.init_rule(config), 42))
    ids = np.random.default_rng(5).integers(0, 256, size=20_000)
    write_token_stream(data, ids, kind="llama3", vocab_size=256)
    out = tmp_path / "o"
    rc = main(["run", "--matrix", "mixtral", "--cases", "mixtral_1", "--frameworks", "pytorch,pytorch-fast",
               "--llmc", str(ckpt_path), "--data", str(data), "--steps", "3", "--device", "cpu", "--out", str(out),
               "--no-history", "--no-report"])
    assert rc == 0
    losses = {}
    for framework in ("pytorch", "pytorch-fast"):
        lines = [json.loads(line) for line in (out / framework / "mixtral_1.jsonl").read_text().splitlines()]
        assert lines[0]["status"] == "ok" and lines[0]["model"]["family"] == "mixtral"
        losses[framework] = [r["loss"] for r in lines if r.get("type") == "step"]
        assert len(losses[framework]) == 3 and all(math.isfinite(v) for v in losses[framework])
    verdict = json.loads((out / "summary.json").read_text())["comparisons"][0]["cases"][0]
    assert verdict["verdict"] == "PASS" and verdict["certificate"]["holds"], verdict
    # 61 parameters: wte, lnfw, lm_head and 2 layers x (ln1w, qkvw, attprojw, ln2w, routerw, 8 experts x 3)
    assert "61 gradients" in verdict["certificate"]["summary"]
    case = next(c for c in load_matrix("mixtral") if c.name == "mixtral_1")
    x, y = TokenBatches(read_token_stream(data, vocab_size=256).tokens, case).micro_batch(0, 0)
    model = reference.Mixtral.from_llmc(load_checkpoint(ckpt_path).tensors, config)
    with torch.no_grad():
        _, loss = model(x, y)
    assert abs(losses["pytorch"][0] - float(loss)) <= LIMIT, (losses["pytorch"][0], float(loss))


def test_bf16_autocast_trains_and_stays_near_fp32(converted):
    """BF16 autocast around the forward (the contract's BF16 cases): the experts' BF16 outputs are
    summed into the FP32 stream (before, index_add refused BF16 into FP32 and every BF16 case
    failed); the loss and the gradients exist and are within BF16's reach of the FP32 step."""
    _, path = converted
    ckpt = load_checkpoint(path)
    ids = torch.as_tensor(tokens())
    losses, grads = {}, {}
    for bf16 in (False, True):
        model = reference.Mixtral.from_llmc(ckpt.tensors, ckpt.config)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits, _ = model(ids[:, :-1], routings=[])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
        loss.backward()
        losses[bf16] = loss.item()
        grads[bf16] = model.lm_head.weight.grad.clone()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    assert abs(losses[True] - losses[False]) < 1e-2, losses
    rel = (grads[True] - grads[False]).norm() / grads[False].norm()
    assert 0 < rel < 5e-2, rel.item()
