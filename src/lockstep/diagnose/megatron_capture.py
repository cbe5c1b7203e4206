"""Step 1 of the megatron worker, seen from inside (run by worker.py when the job asks to diagnose).

Forward: hooks on every model chunk's modules record the first micro batch's outputs on DP rank 0
under canonical names (layout [s, b, h] turned to [b, s, h]); outputs split over TP (the
attention before its row-parallel projection, the vocab-parallel logits) are all-gathered over
the TP group after the step. Gradients: after megatron's forward-backward schedule and
`finalize_model_grads` (DP all-reduce, the tied embedding's all-reduce between first and last
stage), every chunk's `main_grad` goes through `weights.canonical_from_chunk` (the adapter's
reverse map, TP gathered). Every rank then sends its canonical tensors to rank 0, which writes
the capture. No optimizer step is taken.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist

from lockstep.diagnose.capture import StepCapture

# Outputs whose last dimension is split over TP ranks (gathered along it).
TP_SPLIT_OUTPUTS = ("attn", "logits")


def _tensor(out):
    """A module output as one tensor: megatron's (output, bias) pairs are added back together."""
    if isinstance(out, tuple):
        value, bias = out[0], (out[1] if len(out) > 1 else None)
        if isinstance(bias, torch.Tensor) and bias.dim() == 1:
            return value + bias
        return value
    return out


def register_forward_hooks(chunk_module, record) -> list:
    """Hooks on one GPTModel chunk; record(name, tensor [s, b, ...])."""
    handles = []
    if chunk_module.pre_process:
        handles.append(chunk_module.embedding.register_forward_hook(lambda m, a, out: record("embedding", out)))
    for layer in chunk_module.decoder.layers:
        i = int(layer.layer_number) - 1
        att = layer.self_attention
        handles += [
            layer.input_layernorm.register_forward_hook(lambda m, a, out, i=i: record(f"ln1[{i}]", out)),
            att.linear_proj.register_forward_pre_hook(lambda m, args, i=i: record(f"attn[{i}]", args[0])),
            att.register_forward_hook(lambda m, a, out, i=i: record(f"attproj[{i}]", _tensor(out))),
            layer.pre_mlp_layernorm.register_forward_hook(lambda m, a, out, i=i: record(f"ln2[{i}]", out)),
            layer.mlp.register_forward_hook(lambda m, a, out, i=i: record(f"mlp[{i}]", _tensor(out))),
            layer.register_forward_hook(lambda m, a, out, i=i: record(f"block[{i}]", out[0] if isinstance(out, tuple) else out)),
        ]
    if chunk_module.post_process:
        handles += [
            chunk_module.decoder.final_layernorm.register_forward_hook(lambda m, a, out: record("lnf", out)),
            chunk_module.output_layer.register_forward_hook(lambda m, a, out: record("logits", out[0])),
        ]
    return handles


def _gather_tp(t: torch.Tensor, tp: int, group) -> list[torch.Tensor]:
    if tp == 1:
        return [t]
    pieces = [torch.empty_like(t) for _ in range(tp)]
    dist.all_gather(pieces, t.contiguous(), group=group)
    return pieces


def capture_step(*, job, layout, chunks, forward_backward, forward_step, batches, ckpt_config, adapter, vocab_rows,
                 case, StepData) -> dict:
    from megatron.core import parallel_state

    from lockstep.runners.megatron import model as mmodel
    from lockstep.runners.megatron import weights as mweights

    tp_group = parallel_state.get_tensor_model_parallel_group()
    local: dict[str, torch.Tensor] = {}
    order: list[str] = []

    def record(name, t):
        if layout.dp_rank == 0 and name not in local:
            # A copy: megatron's vocab-parallel cross entropy turns the FP32 logits into softmax in place.
            local[name] = t.detach().float().clone()
            order.append(name)

    handles = [h for c in chunks for h in register_forward_hooks(c.module, record)]
    for chunk in chunks:
        chunk.zero_grad_buffer()
    iterators = [StepData(batches, 0, case.accum) for _ in chunks]
    results = forward_backward(forward_step_func=forward_step, data_iterator=iterators if len(chunks) > 1 else iterators[0],
                               model=chunks, num_microbatches=case.accum, seq_length=case.seq_len,
                               micro_batch_size=case.micro_batch, decoder_seq_length=case.seq_len, forward_only=False)
    for h in handles:
        h.remove()

    # Forward outputs: [s, b, ...] -> [b, s, ...], TP-split ones gathered (a collective over each TP group).
    forward: dict[str, np.ndarray] = {}
    for name in sorted(local):
        t = local[name]
        if name.split("[")[0] in TP_SPLIT_OUTPUTS:
            t = torch.cat(_gather_tp(t, layout.tp, tp_group), dim=-1)
        if name == "logits":
            t = t[..., : job.model.vocab_size]
        forward[name] = t.transpose(0, 1).cpu().numpy()
    # The loss of micro batch 0 and the step's loss, where megatron holds them.
    step_loss, first_loss = 0.0, None
    if layout.reports_loss:
        from lockstep.runners.megatron.worker import logged_micro_loss

        means = [logged_micro_loss(r) for r in results]
        step_loss = sum(means) / len(means) / layout.dp
        if layout.dp_rank == 0:
            first_loss = means[0]
    loss_t = torch.tensor([step_loss], dtype=torch.float64, device=layout.device)
    dist.all_reduce(loss_t)

    # Gradients: main_grad of every chunk back to canonical tensors.
    grads: dict[str, np.ndarray] = {}
    for chunk in chunks:
        module = chunk.module
        shard = mweights.ChunkShard(rank=layout.rank, tp_rank=layout.tp_rank, tp_size=layout.tp,
                                    pre_process=module.pre_process, post_process=module.post_process,
                                    layers=mmodel.chunk_layers(module), vocab_rows=vocab_rows)
        # canonical_from_chunk already names per-layer tensors canonically (`qkvw[3]`).
        params = {n: (p.main_grad if getattr(p, "main_grad", None) is not None else torch.zeros_like(p)).detach().float()
                  for n, p in module.named_parameters()}
        got = mweights.canonical_from_chunk(
            params, ckpt_config, shard, adapter,
            lambda t: [p.cpu().numpy() for p in _gather_tp(t, layout.tp, tp_group)])
        grads.update({k: np.asarray(v) for k, v in got.items()})

    mine = {"forward": forward, "order": order, "grads": grads if layout.dp_rank == 0 else {}, "first_loss": first_loss}
    everyone = [None] * layout.world if layout.rank == 0 else None
    dist.gather_object(mine, everyone, dst=0)
    if layout.rank == 0:
        cap = StepCapture(framework="megatron", loss=float(loss_t.item()))
        for part in everyone:
            for name in part["order"]:
                if name in part["forward"] and name not in cap.forward:
                    cap.forward[name] = part["forward"][name]
            for name, g in part["grads"].items():
                cap.grads.setdefault(name, g)
            if part["first_loss"] is not None:
                cap.forward["loss"] = np.array(part["first_loss"])
        cap.forward_order = sorted(cap.forward, key=_forward_rank)
        cap.meta = {"case": case.to_dict(), "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp}
        cap.save(job.diagnose_path)
    return {"diagnose_path": job.diagnose_path}


def _forward_rank(name: str) -> tuple:
    base, _, rest = name.partition("[")
    layer = int(rest.rstrip("]")) if rest else -1
    within = ["embedding", "ln1", "attn", "attproj", "ln2", "mlp", "block", "lnf", "logits", "loss"]
    top = {"embedding": (-1,), "lnf": (10**9,), "logits": (10**9 + 1,), "loss": (10**9 + 2,)}
    if base in top:
        return top[base] + (0,)
    return (layer, within.index(base))
