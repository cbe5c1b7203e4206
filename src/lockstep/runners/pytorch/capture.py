"""Step 1 of a reference module, seen from inside (the `pytorch` runner's capture; `pytorch-fast`
uses it on its SDPA model).

The reference modules (models/<family>/model.py) share their attribute names: `h[i].ln_1`,
`h[i].attn.c_proj`, `h[i].ln_2`, `h[i].mlp`, `ln_f`, and the embedding feeds `h[0]`. Forward
hooks on those give the canonical module outputs; `llmc_parameters()` gives every gradient
under its LLMC name (a LoRA case's adapters too, as `lora_A.qkvw[0]`: models/lora.py; a frozen
base parameter's gradient is zeros). `StepRecorder` rides along step 1 of a real training step (in-run capture:
the gradients are read before the optimizer step, nothing else changes); `capture_step` runs
step 1 on its own without an update, every DP rank's micro batches one after the other in this
process (divided by DP as DDP's average would), for diagnose and for runs the recorder cannot
ride along (several processes).

What is recorded: every module's output on DP rank 0's first micro batch, and its sketch on the
next micro batches (up to MAX_MICRO_BATCHES, so that a pipeline that pairs later micro batches
with the wrong inputs is seen); the gradient arriving at the first micro batch's outputs; every
parameter's gradient of the whole step; and for a tied tensor (GPT-2's wte, read by the
embedding and the output head) the part its embedding use alone gives (`tie/`), so that a
framework that lost the tie is recognised as exactly that.

From a saved state (`lockstep diagnose --at-step N`: the model and its optimizer loaded from the
reference's checkpoint after step N), `capture_step` records step N+1 the same way, on step N+1's
data window, and then lets the optimizer step: the update it applied to each parameter,
(w_before - w_after)/lr, is recorded too (`applied/` sketches), since from a state with Adam's
moments and step count the gradients can agree while the update does not.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

from lockstep.capture.request import MAX_MICRO_BATCHES, CaptureBuilder, CaptureRequest, add_applied_update, micro_name
from lockstep.capture.routing import ROUTER, add_routing
from lockstep.cases.lr_schedule import lr_at
from lockstep.cases.spec import CaseSpec
from lockstep.data.loader import TokenBatches
from lockstep.formats.step_capture import StepCapture
from lockstep.models.lora import canonical_parameters
from lockstep.runners.pytorch import step as reference_step
from lockstep.runners.pytorch.step import MicroBatch
from lockstep.step_contract import fp32_matmul_precision, logged_step_loss

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
    canonical_of = {id(p): name for name, p in canonical_parameters(model).items()}
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


class StepRecorder:
    """Records step 1 of `model` while it trains (see the module docstring).

    Call `micro_batch(dp_rank, micro)` before each forward, `loss(logits, token_losses)` after it,
    and `finish(step_loss, first_x)` after the backward of the last micro batch (before any
    optimizer step); `close()` always (it removes the hooks)."""

    def __init__(self, model: nn.Module, case: CaseSpec, request: CaptureRequest, framework: str = "pytorch",
                 output_grad_scale: float = 1.0):
        self.model, self.case = model, case
        self.builder = CaptureBuilder(request, framework)
        self.scale = output_grad_scale
        self.params = canonical_parameters(model)  # LLMC's, and a LoRA case's adapters (lora_A.qkvw[0], ...)
        self.current: int | None = None  # micro batch being recorded, None: not recording
        self.order: list[str] = []
        self.token_losses: list[np.ndarray] = []
        self.handles = forward_hooks(model, self._record)
        self.restore_routes: list = []
        self._watch_routers()
        self.emb_parts: dict[str, torch.Tensor] = {}
        for module in model.modules():
            if isinstance(module, nn.Embedding):
                name = next((n for n, p in self.params.items() if p is module.weight), None)
                if name is not None:
                    self.handles.append(module.register_forward_hook(self._embedding_hook(name)))

    def _watch_routers(self) -> None:
        """Mixture-of-experts blocks (an `mlp` with a `router` and a `route` rule, models/mixtral): the
        router logits as module output `router[i]`, and what `route` decided (capture/routing.py)."""
        for i, blk in enumerate(getattr(self.model, "h", [])):
            moe = blk.mlp
            if hasattr(moe, "router") and hasattr(moe, "route"):
                self._watch_router(i, moe)

    def _watch_router(self, layer: int, moe: nn.Module) -> None:
        batch: list[tuple[int, int]] = [(0, 0)]  # (B, T) of the block's input: the router sees B*T rows

        def block_input(module, args):
            batch[0] = tuple(args[0].shape[:2])

        def router_output(module, args, logits):
            self._record(f"{ROUTER}[{layer}]", logits.view(*batch[0], -1))

        route = moe.route

        def recorded_route(logits, topk):
            experts, weights = route(logits, topk)
            if self.current == 0:
                with torch.no_grad():
                    aux = self.model.layer_aux_loss(logits.detach(), experts)
                add_routing(self.builder, layer, experts.view(*batch[0], -1), weights.detach().view(*batch[0], -1), aux)
            return experts, weights

        self.handles += [moe.register_forward_pre_hook(block_input), moe.router.register_forward_hook(router_output)]
        self.restore_routes.append((moe, route))
        moe.route = recorded_route

    def _embedding_hook(self, name: str):
        # The embedding-use gradient of a parameter read by an nn.Embedding: the gradient arriving at
        # the lookup's output, added up by index over the whole step.
        def on_lookup(module, args, out):
            idx = args[0].reshape(-1)
            if name not in self.emb_parts:
                self.emb_parts[name] = torch.zeros_like(module.weight, dtype=torch.float32)
            part = self.emb_parts[name]

            def add(g: torch.Tensor) -> None:  # returns None: the gradient flows on unchanged
                part.index_add_(0, idx, g.reshape(idx.numel(), -1).float())

            if out.requires_grad:
                out.register_hook(add)
        return on_lookup

    def _record(self, name: str, t: torch.Tensor) -> None:
        micro = self.current
        if micro is None:
            return
        if micro == 0:
            self.order.append(name)
            self.builder.add("fwd", name, t)
            if t.requires_grad:
                t.register_hook(lambda g, name=name: self.builder.add("outgrad", name, g.detach().float() * self.scale))
        else:
            self._sketch_only("fwd", micro_name(name, micro), t)

    def _sketch_only(self, kind: str, name: str, t: torch.Tensor) -> None:
        from lockstep.capture.request import make_sketch

        self.builder.capture.sketches[f"{kind}/{name}"] = make_sketch(self.builder.rows_of(t.detach().float()))

    def micro_batch(self, dp_rank: int, micro: int) -> None:
        self.current = micro if dp_rank == 0 and micro < MAX_MICRO_BATCHES else None

    def loss(self, logits: torch.Tensor, token_losses: torch.Tensor) -> None:
        """After the forward of the current micro batch: its logits and its mean token loss."""
        self.token_losses.append(token_losses.detach().float().cpu().numpy())
        if self.current is None:
            return
        self._record("logits", logits)
        mean = token_losses.detach().double().mean().reshape(())
        if self.current == 0:
            self.order.append("loss")
            self.builder.add("fwd", "loss", mean)
        else:
            self._sketch_only("fwd", micro_name("loss", self.current), mean)
        self.current = None

    def finish(self, step_loss: float, first_x: torch.Tensor, write: bool = True) -> StepCapture:
        """The step's capture, written to the request's path (unless `write` is False: the
        caller adds what comes after the gradients, the optimizer's update, and writes it)."""
        cap = self.builder.capture
        grads = {}
        for name, p in self.params.items():
            g = p.grad if p.grad is not None else torch.zeros_like(p)
            grads[name] = g.detach().float()
            self.builder.add("grad", name, grads[name])
        for name, part in self.emb_parts.items():
            full = grads[name]
            if torch.linalg.vector_norm(full - part) > TIED_SHARE * max(float(torch.linalg.vector_norm(full)), 1e-30):
                self.builder.add("tie", name, part)
        self.close()
        with torch.no_grad():
            cap.param_order, cap.module_kind = parameter_structure(self.model, lambda: self.model(first_x[:1, :2]))
        cap.loss = step_loss
        cap.forward_order = self.order
        cap.token_losses = np.stack(self.token_losses) if self.token_losses else None
        cap.meta.update({"device": str(first_x.device), "case": self.case.to_dict()})
        return self.builder.finish() if write else cap

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        for moe, route in self.restore_routes:
            moe.route = route
        self.restore_routes = []


def capture_step(model: nn.Module, case: CaseSpec, tokens: np.ndarray, request: CaptureRequest,
                 device: torch.device | str = "cpu", framework: str = "pytorch",
                 optimizer: torch.optim.Optimizer | None = None) -> StepCapture:
    """Step 1 of `model` under the contract without an optimizer update; the weights are step 0's.
    Every DP rank's micro batches run here one after the other, each loss divided by accum·DP.

    With `optimizer` (fresh at step 1, or the model and it loaded from the state after step
    `request.start_step`), step start_step+1 on its own data window, and then the optimizer's
    step: its applied update is recorded as well (`applied/`), and the model holds the weights
    after it."""
    device = torch.device(device)
    model = model.to(device)
    model.zero_grad(set_to_none=True)
    # The backward below is of mean / (accum * dp); a framework's own backward of a micro batch is
    # of mean / accum (DP averages parameter gradients, not activations): output gradients × DP.
    recorder = StepRecorder(model, case, request, framework=framework, output_grad_scale=case.dp)
    divisor = case.accum * case.dp
    before: dict[str, torch.Tensor] = {}

    def micro_batches():
        for dp_rank in range(case.dp):
            batches = TokenBatches(tokens, case, dp_rank=dp_rank)
            for micro in range(case.accum):
                x, y = batches.micro_batch(request.start_step, micro)
                yield MicroBatch(x.to(device), y.to(device), dp_rank, micro)

    def losses_of(mb: MicroBatch) -> torch.Tensor:
        recorder.micro_batch(mb.dp_rank, mb.micro)
        return reference_step.token_losses(model, mb.x, mb.y, case.is_bf16, recorder.loss)

    captured: list[StepCapture] = []

    def finish(means: list[torch.Tensor], first_x: torch.Tensor) -> None:
        captured.append(recorder.finish(logged_step_loss(means, case.accum, case.dp), first_x,
                                        write=optimizer is None))
        if optimizer is not None:
            before.update({n: p.detach().clone() for n, p in recorder.params.items()})

    lr = reference_step.set_lr(optimizer, lr_at(case, request.step)) if optimizer is not None else None
    try:
        with fp32_matmul_precision(enabled_tf32=False):
            # No optimizer: the step's gradients are recorded, the weights stay step 0's.
            reference_step.contract_step(micro_batches(), losses_of, divisor, optimizer, before_update=finish)
    finally:
        recorder.close()
    capture = captured[0]
    if optimizer is not None:
        add_applied_update(recorder.builder, before, recorder.params, lr, request.step)
        capture = recorder.builder.finish()
    model.zero_grad(set_to_none=True)
    return capture


def capture_reference(model: nn.Module, case: CaseSpec, tokens: np.ndarray, device: torch.device | str = "cpu",
                      framework: str = "pytorch", request: CaptureRequest | None = None) -> StepCapture:
    """`capture_step` with whole tensors, kept in memory (tests, and diagnose's in-process use)."""
    import tempfile
    from pathlib import Path

    if request is not None:
        return capture_step(model, case, tokens, request, device, framework)
    with tempfile.TemporaryDirectory(prefix="lockstep-capture-") as td:
        cap = capture_step(model, case, tokens, CaptureRequest(path=str(Path(td) / "step1.npz"), full=True),
                           device, framework)
    return cap
