"""Step 1 of the reference trainer, seen from inside: every module's output and every gradient.

The reference modules (models/<family>/model.py) share their attribute names: `h[i].ln_1`,
`h[i].attn.c_proj`, `h[i].ln_2`, `h[i].mlp`, `ln_f`, and the embedding feeds `h[0]`. Forward
hooks on those give the canonical forward outputs; `llmc_parameters()` gives every gradient
under its LLMC name. The step is the trainer's (runners/pytorch/train.py): the contract's data
order, mean CE / accum, and with DP > 1 every DP rank's micro batches run one after the other
in this one process, divided by DP as DDP's average would.

A tied tensor (GPT-2's wte, read by the embedding and the output head) gets its gradient from
two uses; the capture keeps the embedding use's part (`tie_parts`) so that a framework that
lost the tie (its wte gets only the embedding's part) is recognised as exactly that.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.diagnose.capture import StepCapture

# A tensor counts as tied when uses other than its embedding lookup carry this share of its gradient.
TIED_SHARE = 1e-3


def forward_hooks(model: nn.Module, record) -> list:
    """Hooks that call record(name, tensor) with each canonical module output (reference modules)."""
    handles = [model.h[0].register_forward_pre_hook(lambda m, args: record("embedding", args[0]))]
    for i, blk in enumerate(model.h):
        handles += [
            blk.ln_1.register_forward_hook(lambda m, a, out, i=i: record(f"ln1[{i}]", out)),
            blk.attn.c_proj.register_forward_pre_hook(lambda m, args, i=i: record(f"attn[{i}]", args[0])),
            blk.attn.c_proj.register_forward_hook(lambda m, a, out, i=i: record(f"attproj[{i}]", out)),
            blk.ln_2.register_forward_hook(lambda m, a, out, i=i: record(f"ln2[{i}]", out)),
            blk.mlp.register_forward_hook(lambda m, a, out, i=i: record(f"mlp[{i}]", out)),
            blk.register_forward_hook(lambda m, a, out, i=i: record(f"block[{i}]", out)),
        ]
    handles.append(model.ln_f.register_forward_hook(lambda m, a, out: record("lnf", out)))
    return handles


def parameter_structure(model: nn.Module, run_forward) -> tuple[list[str], dict[str, str]]:
    """Canonical parameter names in the order the forward pass first uses their modules, and the
    type of the module owning each (LayerNorm, Linear, ...)."""
    canonical_of = {id(p): name for name, p in model.llmc_parameters().items()}
    order: list[str] = []
    kind: dict[str, str] = {}

    def seen(module, *_):
        for p in module.parameters(recurse=False):
            name = canonical_of.get(id(p))
            if name is not None and name not in kind:
                order.append(name)
                kind[name] = type(module).__name__

    handles = [m.register_forward_pre_hook(seen) for m in model.modules() if any(True for _ in m.parameters(recurse=False))]
    try:
        run_forward()
    finally:
        for h in handles:
            h.remove()
    order += [n for n in canonical_of.values() if n not in kind]  # never used by the forward pass
    return order, kind


def capture_reference(model: nn.Module, case: CaseSpec, tokens: np.ndarray, device: torch.device | str = "cpu",
                      framework: str = "pytorch", with_forward: bool = True) -> StepCapture:
    """One step (no optimizer update) of `model` under the contract; the model's weights are step 0's."""
    from lockstep.runners.pytorch.train import fp32_matmul_precision

    device = torch.device(device)
    model = model.to(device)
    model.zero_grad(set_to_none=True)
    params = model.llmc_parameters()
    forward: dict[str, np.ndarray] = {}
    order: list[str] = []
    state = {"on": False}

    output_grads: dict[str, np.ndarray] = {}

    def record(name, t):
        if state["on"] and name not in forward:
            forward[name] = t.detach().float().cpu().numpy().copy()
            order.append(name)
            if t.requires_grad:
                # The backward below is of mean / (accum * dp); a framework's own backward of this
                # micro batch is of mean / accum (DP averages parameter gradients, not activations).
                t.register_hook(lambda g, name=name: output_grads.__setitem__(
                    name, (g.detach().float() * case.dp).cpu().numpy().copy()))

    # Embedding-use gradient of every parameter read by an nn.Embedding: index_add of the grad
    # arriving at the lookup's output.
    emb_parts: dict[str, torch.Tensor] = {}
    tie_handles = []
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            name = next((n for n, p in params.items() if p is module.weight), None)
            if name is None:
                continue
            emb_parts[name] = torch.zeros_like(module.weight, dtype=torch.float32)

            def on_lookup(m, args, out, name=name):
                idx = args[0].reshape(-1)
                def add(g):
                    emb_parts[name].index_add_(0, idx, g.reshape(idx.numel(), -1).float())  # returns None: g unchanged

                if out.requires_grad:
                    out.register_hook(add)
            tie_handles.append(module.register_forward_hook(on_lookup))

    handles = forward_hooks(model, record) if with_forward else []
    token_losses, logged = [], 0.0
    first_x = None
    try:
        with fp32_matmul_precision(enabled_tf32=False):
            for dp_rank in range(case.dp):
                batches = TokenBatches(tokens, case, dp_rank=dp_rank)
                for micro in range(case.accum):
                    x, y = batches.micro_batch(0, micro)
                    x, y = x.to(device), y.to(device)
                    if first_x is None:
                        first_x = x
                    state["on"] = with_forward and dp_rank == 0 and micro == 0
                    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.is_bf16):
                        logits, _ = model(x)
                    losses = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1), reduction="none")
                    if state["on"]:
                        record("logits", logits)
                        forward["loss"] = np.array(losses.detach().double().mean().item())
                        order.append("loss")
                    state["on"] = False
                    (losses.mean() / (case.accum * case.dp)).backward()
                    token_losses.append(losses.detach().float().cpu().numpy())
                    logged += float(losses.detach().double().mean().item()) / (case.accum * case.dp)
    finally:
        for h in handles + tie_handles:
            h.remove()
    grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).detach().float().cpu().numpy().copy()
             for n, p in params.items()}
    tie_parts = {}
    for name, part in emb_parts.items():
        part = part.cpu().numpy()
        full = grads[name]
        if np.linalg.norm(full - part) > TIED_SHARE * max(np.linalg.norm(full), 1e-30):
            tie_parts[name] = part
    with torch.no_grad():
        param_order, module_kind = parameter_structure(model, lambda: model(first_x[:1, :2]))
    model.zero_grad(set_to_none=True)
    return StepCapture(framework=framework, loss=logged, forward=forward, forward_order=order,
                       output_grads={n: output_grads[n] for n in order if n in output_grads}, grads=grads,
                       tie_parts=tie_parts, token_losses=np.stack(token_losses), param_order=param_order,
                       module_kind=module_kind, meta={"device": str(device), "case": case.to_dict()})
