"""megatron-core's batched pipeline p2p swaps activations and gradients with PP=2 and VPP (no lockstep).

Standalone: megatron-core and torch only, on the CPU over gloo (two processes), a tiny Qwen3-like
GPT (4 layers, C=128, 8 query heads in 4 groups, QK-norm, RMSNorm, SwiGLU, RoPE, V=512, untied
output). One forward-backward step of M=4 micro batches (B=4, T=32) through megatron-core's own
pipeline schedule, for each layout and p2p setting:

    pp1                 one process, no pipeline: the reference
    pp2/batched         PP=2, batch_p2p_comm=True (megatron-core's default)
    pp2vpp2/batched     PP=2 x VPP=2, batch_p2p_comm=True (the default): WRONG from micro batch 2 on
    pp2vpp2/unbatched   PP=2 x VPP=2, batch_p2p_comm=False
    pp2vpp2/overlap     PP=2 x VPP=2, overlap_p2p_comm=True, batch_p2p_comm=False (Megatron-LM's choice)

and prints each micro batch's loss and, per parameter, the gradient's largest difference from
pp1 relative to pp1's largest gradient element.

Why: in `_batched_p2p_ops` (pipeline_parallel/p2p_communication.py) every rank posts
[send_prev, recv_prev, send_next, recv_next] in one `batch_isend_irecv`. With a pipeline group of
two ranks prev == next, so when the interleaved schedule exchanges both directions at once
(`send_forward_backward_recv_forward_backward`), rank 0 sends rank 1 [gradient, activation] while
rank 1 posts its receives from rank 0 as [activation buffer, gradient buffer]. Point-to-point
messages between two ranks carry no tag here and match in order, the shapes are equal, so the
activation lands in the gradient buffer and the other way round, silently. `_p2p_ops` (unbatched)
orders its posts by even/odd rank and uses two process groups for the two directions: correct.

CUDA is not needed: `torch.cuda.synchronize()` (called after every batched exchange) is made a
no-op, and the few CUDA device names megatron-core uses are mapped to the CPU. Run:

    python repro_batched_p2p_vpp.py            # every layout above; about a minute on 2 cores
    python repro_batched_p2p_vpp.py --micro 2  # M=2: every exchange is one-way, batched is exact too
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import zlib

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

LAYERS, HIDDEN, HEADS, GROUPS, FFN, VOCAB = 4, 128, 8, 4, 256, 512
B, T = 4, 32

LAYOUTS = {
    "pp1": dict(pp=1, vpp=1, batch=False, overlap=False),
    "pp2/batched": dict(pp=2, vpp=1, batch=True, overlap=False),
    "pp2vpp2/batched": dict(pp=2, vpp=2, batch=True, overlap=False),
    "pp2vpp2/unbatched": dict(pp=2, vpp=2, batch=False, overlap=False),
    "pp2vpp2/overlap": dict(pp=2, vpp=2, batch=False, overlap=True),
}


class CudaOnCpu(TorchFunctionMode):
    """megatron-core names CUDA for a few tensors (the schedules' token counter, RoPE's frequencies): the CPU instead."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if (isinstance(device, str) and device.startswith("cuda")) or (
                isinstance(device, torch.device) and device.type == "cuda") or (
                isinstance(device, int) and not isinstance(device, bool)):  # torch.cuda.current_device() below
            kwargs = {**kwargs, "device": torch.device("cpu")}
        if func is torch.Tensor.cuda:
            return args[0]
        return func(*args, **kwargs)


class CpuStream:
    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def synchronize(self):
        pass


def no_cuda() -> None:
    torch.cuda.synchronize = lambda *a, **k: None  # the batched path's barrier; CPU work is synchronous
    torch.cuda.current_device = lambda: 0
    torch.cuda.current_stream = lambda *a, **k: CpuStream()
    CudaOnCpu().__enter__()


def global_name(name: str, chunk) -> str:
    """The parameter's name in the whole model: local layer index -> global layer (megatron numbers from 1)."""
    m = re.match(r"decoder\.layers\.(\d+)\.(.*)", name)
    if not m:
        return name
    layer = chunk.decoder.layers[int(m.group(1))]
    return f"decoder.layers.{int(layer.layer_number) - 1}.{m.group(2)}"


def init_value(name: str, shape) -> torch.Tensor:
    """The same value for a parameter whatever rank or chunk holds it: seeded by its global name."""
    if name.endswith("layernorm.weight") or name.endswith("final_layernorm.weight"):
        return torch.ones(shape)
    g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    return torch.randn(shape, generator=g) * 0.02


def batches(micro: int) -> list[dict]:
    g = torch.Generator().manual_seed(1234)
    data = torch.randint(0, VOCAB, (micro, B, T + 1), generator=g)
    return [dict(tokens=d[:, :-1].contiguous(), labels=d[:, 1:].contiguous()) for d in data]


def worker(rank: int, world: int, store: str, layout: dict, micro: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from megatron.core import parallel_state
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import random as mpu_random
    from megatron.core.transformer.transformer_config import TransformerConfig

    pp, vpp = layout["pp"], layout["vpp"]
    parallel_state.initialize_model_parallel(1, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None)
    no_cuda()
    mpu_random.initialize_rng_tracker(inference_rng_tracker=True, force_reset=True)  # no dropout: nothing to fork
    torch.manual_seed(0)
    config = TransformerConfig(
        num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS, num_query_groups=GROUPS,
        ffn_hidden_size=FFN, kv_channels=HIDDEN // HEADS, normalization="RMSNorm", qk_layernorm=True,
        activation_func=F.silu, gated_linear_unit=True, add_bias_linear=False, add_qkv_bias=False,
        bias_activation_fusion=False, masked_softmax_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
        hidden_dropout=0.0, attention_dropout=0.0, attention_softmax_in_fp32=True,
        pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        pipeline_dtype=torch.float32, params_dtype=torch.float32, use_cpu_initialization=True,
        perform_initialization=False,
        batch_p2p_comm=layout["batch"], overlap_p2p_comm=layout["overlap"],
    )
    # Count the exchanges that send both ways to the one peer in one batch (the ones that swap).
    from megatron.core.pipeline_parallel import p2p_communication

    two_way = []
    batched = p2p_communication._batched_p2p_ops

    def counting(**kw):
        if kw["tensor_send_prev"] is not None and kw["tensor_send_next"] is not None \
                and kw["prev_pipeline_rank"] == kw["next_pipeline_rank"]:
            two_way.append(1)
        return batched(**kw)

    p2p_communication._batched_p2p_ops = counting
    spec = get_gpt_layer_local_spec(normalization="RMSNorm", qk_layernorm=True)
    chunks = []
    for v in range(vpp):
        if vpp > 1:
            pre = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=v)
            post = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=v)
        else:
            pre, post = parallel_state.is_pipeline_first_stage(), parallel_state.is_pipeline_last_stage()
        kwargs = dict(vp_stage=v) if vpp > 1 else {}
        chunks.append(GPTModel(config=config, transformer_layer_spec=spec, vocab_size=VOCAB, max_sequence_length=T,
                               pre_process=pre, post_process=post, share_embeddings_and_output_weights=False,
                               position_embedding_type="rope", **kwargs))
    with torch.no_grad():
        for chunk in chunks:
            for name, p in chunk.named_parameters():
                p.copy_(init_value(global_name(name, chunk), p.shape))

    data = batches(micro)
    positions = torch.arange(T).unsqueeze(0).expand(B, T)
    mask = ~torch.ones(T, T, dtype=torch.bool).tril()[None, None]  # True = masked

    class Micro:
        def __init__(self):
            self.i = 0

        def __next__(self):
            self.i += 1
            return data[self.i - 1]

    def forward_step(iterator, model):
        reads = model.pre_process or model.post_process
        batch = next(iterator) if reads else {}
        output = model(batch.get("tokens"), positions, mask)

        def loss_func(output_tensor):
            loss = F.cross_entropy(output_tensor.float().reshape(-1, VOCAB), batch["labels"].reshape(-1))
            # clone: the schedule divides the returned loss by M in place, and a detached view follows it
            return loss, {"loss": loss.detach().clone()}

        return output, loss_func

    iterators = [Micro() for _ in chunks]
    results = get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iterators if vpp > 1 else iterators[0],
        model=chunks if vpp > 1 else chunks[0], num_microbatches=micro, seq_length=T, micro_batch_size=B,
        forward_only=False)
    found = {"losses": [float(r["loss"]) for r in results], "grads": {}, "two_way": len(two_way)}
    for chunk in chunks:
        for name, p in chunk.named_parameters():
            found["grads"][global_name(name, chunk)] = p.grad.tolist()
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump(found, f)
    dist.barrier()
    dist.destroy_process_group()


def run(layout: dict, micro: int) -> dict:
    with tempfile.TemporaryDirectory() as td:
        world = layout["pp"]
        mp.spawn(worker, args=(world, os.path.join(td, "store"), layout, micro, os.path.join(td, "r")), nprocs=world)
        merged = {"losses": [], "grads": {}, "two_way": []}
        for rank in range(world):
            with open(os.path.join(td, f"r.{rank}.json")) as f:
                part = json.load(f)
            merged["losses"] += part["losses"]  # only the last stage reports losses
            merged["two_way"].append(part["two_way"])
            merged["grads"].update({k: torch.tensor(v) for k, v in part["grads"].items()})
        return merged


def short(name: str) -> str:
    return (name.replace("decoder.layers.", "L").replace("self_attention.", "attn.").replace(".weight", "")
            .replace("embedding.word_embeddings", "wte"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--micro", type=int, default=4, help="micro batches per step (a multiple of PP=2)")
    args = parser.parse_args()
    import megatron.core

    print(f"megatron-core {megatron.core.__version__}, torch {torch.__version__}, gloo on the CPU; "
          f"{LAYERS} layers, C={HIDDEN}, V={VOCAB}, B={B}, T={T}, {args.micro} micro batches")
    runs = {name: run(layout, args.micro) for name, layout in LAYOUTS.items()}
    ref = runs["pp1"]
    print(f"\n{'layout':20s} micro-batch losses")
    for name, r in runs.items():
        losses = "  ".join(f"{x:.6f}" for x in r["losses"])
        diff = max(abs(a - b) for a, b in zip(r["losses"], ref["losses"]))
        print(f"{name:20s} {losses}   max |dloss| vs pp1 {diff:.2e}")
    names = list(ref["grads"])
    print("\nper parameter: max |grad - grad(pp1)| / max |grad(pp1)|")
    print(f"{'parameter':28s} " + " ".join(f"{n:>18s}" for n in runs if n != "pp1"))
    worst = {}
    for p in names:
        cells = []
        for n, r in runs.items():
            if n == "pp1":
                continue
            rel = float((r["grads"][p] - ref["grads"][p]).abs().max() / ref["grads"][p].abs().max())
            worst[n] = max(worst.get(n, 0.0), rel)
            cells.append(f"{rel:18.2e}")
        print(f"{short(p):28s} " + " ".join(cells))
    print("\nverdict (exact = losses and every gradient bitwise equal to pp1):")
    for n, r in runs.items():
        if n == "pp1":
            continue
        exact = r["losses"] == ref["losses"] and worst[n] == 0.0
        print(f"  {n:20s} {'exact' if exact else 'DIFFERS'} (largest relative gradient difference {worst[n]:.2e}; "
              f"batched exchanges sending both ways to the one peer, per rank: {r['two_way']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
