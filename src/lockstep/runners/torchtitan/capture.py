"""Step 1 of a torchtitan case, seen from inside (the `torchtitan` runner's capture, after its run).

torchtitan's own model (model.py: its Llama3Model / Qwen3Model at the case's shape, the LLMC
weights mapped in by state_dict.py, the same mapping the Trainer's run loads) and torchtitan's
loss (its CrossEntropyLoss: the FP32 sum over tokens divided by the step's token count, as its
Trainer normalizes), one device, no optimizer update. Forward hooks give the canonical module
outputs (embedding, ln1/attn/attproj/ln2/mlp/block per layer, lnf, logits, loss) and the
gradients arriving at them; every parameter's gradient is read back under its LLMC name. A
mapping defect (RoPE pairs, gate/up, q/k/v rows) shows there as the first module and the
gradients it touches, which is what the certificate names.

From the reference's state after step N (diagnose --at-step N): the state's weights and Adam
moments go through the same weight mapping into the model and torchtitan's own optimizer (its
OptimizersContainer, as the Trainer builds it), whose step N+1 then runs; the update it applied,
(w_before - w_after)/lr under LLMC names, is recorded as the reference records its own.

Attention is torchtitan's ScaledDotProductAttention module (is_causal) here, whatever the device:
the Trainer's run uses FlexAttention on CUDA (model.py), the same causal softmax(QK^T)V.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from lockstep.capture.request import CaptureBuilder, CaptureRequest
from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.errors import RunError
from lockstep.formats.tokens import read_token_stream


def forward_hooks(model, num_layers: int, record) -> list:
    """Hooks that call record(name, tensor) with each canonical module output."""
    handles = [model.tok_embeddings.register_forward_hook(lambda m, a, out: record("embedding", out))]
    for i in range(num_layers):
        blk = model.layers[str(i)]
        handles += [
            blk.attention_norm.register_forward_hook(lambda m, a, out, i=i: record(f"ln1[{i}]", out)),
            blk.attention.wo.register_forward_pre_hook(lambda m, args, i=i: record(f"attn[{i}]", args[0])),
            blk.attention.wo.register_forward_hook(lambda m, a, out, i=i: record(f"attproj[{i}]", out)),
            blk.ffn_norm.register_forward_hook(lambda m, a, out, i=i: record(f"ln2[{i}]", out)),
            blk.feed_forward.register_forward_hook(lambda m, a, out, i=i: record(f"mlp[{i}]", out)),
            blk.register_forward_hook(lambda m, a, out, i=i: record(f"block[{i}]", out)),
        ]
    handles.append(model.norm.register_forward_hook(lambda m, a, out: record("lnf", out)))
    return handles


def load_model(checkpoint: str, device: torch.device):
    """torchtitan's model with the checkpoint's weights, through the runner's weight mapping."""
    from lockstep.runners.torchtitan.model import build_model
    from lockstep.runners.torchtitan.state_dict import from_llmc
    from lockstep.runners.torchtitan.weights import llmc_tensors

    tensors, cfg = llmc_tensors(checkpoint)
    model = build_model(cfg.family, cfg, "cpu")
    result = model.load_state_dict(from_llmc(tensors, cfg), strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(("freqs_cis", "cache"))]
    if missing or result.unexpected_keys:
        raise RunError(f"{checkpoint}: the LLMC weights do not fill torchtitan's model (missing {missing}, "
                       f"unexpected {list(result.unexpected_keys)})")
    return model.to(device), cfg


class Recorder:
    def __init__(self, builder: CaptureBuilder):
        self.builder, self.micro, self.order = builder, 0, []

    def __call__(self, name: str, t: torch.Tensor) -> None:
        if self.micro != 0:
            return
        self.order.append(name)
        self.builder.add("fwd", name, t)
        if t.requires_grad:
            t.register_hook(lambda g, name=name: self.builder.add("outgrad", name, g.detach().float()))


def capture_case(case: CaseSpec, inputs, request: CaptureRequest, framework: str = "torchtitan"):
    """Step 1 of the case (one device) as `request` asks, written to `request.path` and returned."""
    from lockstep.runners.torchtitan import compat
    from lockstep.runners.torchtitan.weights import canonical

    compat.prepare(inputs.device)
    device = torch.device("cuda", 0) if inputs.device == "cuda" else torch.device("cpu")
    model, cfg = load_model(str(inputs.checkpoint), device)
    optimizer = start_optimizer(model, cfg, case, inputs, request, device) if request.records_applied else None
    stream = read_token_stream(inputs.tokens, vocab_size=cfg.vocab_size)
    batches = TokenBatches(stream.tokens, case)
    builder = CaptureBuilder(request, framework)
    recorder = Recorder(builder)
    handles = forward_hooks(model, cfg.num_layers, recorder)
    tokens_in_step = case.micro_batch * case.seq_len * case.accum
    positions = torch.arange(case.seq_len, device=device).expand(case.micro_batch, case.seq_len)
    means, token_losses = [], []
    try:
        for micro in range(case.accum):
            recorder.micro = micro
            x, y = (t.to(device) for t in batches.micro_batch(request.start_step, micro))
            pred = model(x, positions=positions)
            per_token = torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), y.flatten(), reduction="none")
            token_losses.append(per_token.detach().float().cpu().numpy())
            means.append(per_token.detach().double().mean())
            if micro == 0:
                recorder("logits", pred)
                recorder.order.append("loss")
                builder.add("fwd", "loss", means[-1].reshape(()))
            # torchtitan's loss: the FP32 sum of the token losses over the step's token count
            loss = torch.nn.functional.cross_entropy(pred.flatten(0, 1).float(), y.flatten(), reduction="sum")
            (loss / tokens_in_step).backward()
    finally:
        for h in handles:
            h.remove()
    grads = canonical({n: (p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()},
                      cfg)
    for name, g in grads.items():
        builder.add("grad", name, g.detach().float())
    if optimizer is not None:
        step_optimizer(optimizer, model, cfg, case, request, builder)
    cap = builder.capture
    cap.param_order, cap.module_kind = list(grads), {}
    cap.forward_order = recorder.order
    cap.loss = float(torch.stack(means).mean())
    cap.token_losses = np.stack(token_losses)
    cap.meta.update({"device": str(device), "case": case.to_dict(),
                     "attention": "torchtitan ScaledDotProductAttention (is_causal)"})
    return builder.finish()


def start_optimizer(model, cfg, case: CaseSpec, inputs, request: CaptureRequest, device):
    """torchtitan's optimizer for the captured step: fresh at step 1, else loaded with the model from
    the reference's saved state (weights, both Adam moments, its step count) under the weight map."""
    from lockstep.runners.torchtitan.model import build_optimizer
    from lockstep.runners.torchtitan.state_dict import from_llmc

    optimizer = build_optimizer(model, case.optimizer_of(inputs.family.optimizer), case.lr)
    if request.start_state is None:
        return optimizer
    from lockstep.runners.reference import SavedState, reference_services

    state = reference_services().read_state(SavedState(request.start_step, Path(request.start_state)), case, inputs)

    def mapped(tensors: dict) -> dict[str, torch.Tensor]:
        return from_llmc({n: torch.from_numpy(np.array(t, dtype=np.float32)) for n, t in tensors.items()}, cfg)

    weights = mapped(state.weights)
    moments = (mapped(state.exp_avg), mapped(state.exp_avg_sq)) if state.exp_avg else None
    (adam,) = optimizer.optimizers
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(weights[name].to(device))
            if moments is not None:
                adam.state[p] = {"step": torch.tensor(float(state.adam_step)),
                                 "exp_avg": moments[0][name].to(device).clone(),
                                 "exp_avg_sq": moments[1][name].to(device).clone()}
    return optimizer


def step_optimizer(optimizer, model, cfg, case: CaseSpec, request: CaptureRequest, builder: CaptureBuilder) -> None:
    """The captured step's update at the contract's lr of the step, recorded as applied/NAME."""
    from lockstep.cases.lr_schedule import lr_at
    from lockstep.capture.request import add_applied_update
    from lockstep.runners.torchtitan.weights import canonical

    lr = lr_at(case, request.step)
    for adam in optimizer.optimizers:
        for group in adam.param_groups:
            group["lr"] = lr
    named = dict(model.named_parameters())
    before = {n: t.detach().clone() for n, t in canonical(named, cfg).items()}
    optimizer.step()
    add_applied_update(builder, before, canonical(named, cfg), lr, request.step)
