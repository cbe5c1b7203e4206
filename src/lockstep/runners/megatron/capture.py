"""Step 1 of the megatron worker, seen from inside: the `megatron` runner's capture.

`StepRecorder` rides along step 1 of the worker's training loop (the schedule runs as it always
does; the gradients are read after `finalize_model_grads`, before the optimizer step):

- Forward: hooks on every model chunk's modules. A module's k-th call in a step is micro batch
  k for every schedule (each stage takes micro batches in order), so every micro batch of DP
  rank 0 up to MAX_MICRO_BATCHES is seen, not only the first: a pipeline that hands a later micro
  batch the wrong activation shows there. A forward replayed inside the backward (activation
  recompute) is not a call: it would shift every later micro batch's index by one. Each rank
  sketches its share of an output in the canonical (b, s, ...) layout with the canonical index of every element (capture/sketch.py):
  a replicated output on TP rank 0, a sequence-parallel or a TP-split output (attention before
  its row-parallel projection, the vocab-parallel logits) on every TP rank, and the shares add up
  on rank 0. For `lockstep diagnose` (whole tensors) micro batch 0's outputs are gathered whole.
- Gradients: every chunk's `main_grad` through the adapter's reverse map (`canonical_from_chunk`,
  TP pieces gathered on the device), sketched or copied on DP rank 0 / TP rank 0 of each stage.
- Losses: each micro batch's mean token loss from what the loss function reported, and step 1's
  per-token losses (one DP replica) for the logging emulation.

- The optimizer's update (a request that `records_applied`: diagnose): the canonical weights
  before the optimizer's step and after it, (w_before - w_after)/lr sketched as `applied/NAME`,
  TP pieces gathered and PP stages sent as the gradients are.

The step recorded is the run's first: step 1, or after a resume (diagnose --at-step N, from the
reference's state written as megatron's own step folder) step N+1.

Everything goes to rank 0 (gather_object), which writes the capture.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch
import torch.distributed as dist

from lockstep.capture.request import (MAX_MICRO_BATCHES, CaptureBuilder, CaptureRequest, adam_first_update, make_sketch,
                                      micro_name)
from lockstep.capture.routing import ROUTER, add_routing, ranked_experts
from lockstep.capture.sketch import sketch_torch
from lockstep.formats.step_capture import APPLIED, Sketch, forward_rank

# Outputs whose last dimension is split over TP ranks.
TP_SPLIT_OUTPUTS = ("attn", "logits")


def logged_micro_loss(reported: dict) -> float:
    """The micro batch's mean token loss in FP64, from what the worker's `loss_func` reported."""
    per_token, loss_mask = reported["lm loss tokens"]
    mask = loss_mask.double()
    return float((per_token.double() * mask).sum() / mask.sum())


def replaying() -> bool:
    """Whether a module runs inside the autograd engine's backward: activation recompute's replay
    of a forward the step already made."""
    return torch._C._current_graph_task_id() != -1


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


def _unwrap(chunk):
    module = chunk
    while hasattr(module, "module"):  # DDP (and Float16Module) wrappers
        module = module.module
    return module


class StepRecorder:
    """Records step 1 of the worker's training step (see the module docstring); every rank makes
    one before the step's forward-backward and calls `finish` after it (a collective)."""

    def __init__(self, *, request: CaptureRequest, layout, chunks, case, model, adapter, vocab_rows: int,
                 framework: str = "megatron"):
        self.request, self.layout, self.chunks, self.case = request, layout, chunks, case
        self.model, self.adapter, self.vocab_rows, self.framework = model, adapter, vocab_rows, framework
        self.calls: dict[str, int] = defaultdict(int)
        self.shares: dict[str, tuple[torch.Tensor, float, tuple]] = {}  # key -> (sketch share, norm² share, shape)
        self.whole: dict[str, torch.Tensor] = {}  # micro batch 0, diagnose: [s, b, ...] local pieces
        self.order: list[str] = []
        self.handles = [h for c in chunks for h in register_forward_hooks(_unwrap(c), self._record)]
        # MoE layers: each router's logits, map and probabilities on micro batch 0, as this rank saw them
        self.routing: dict[int, dict[str, torch.Tensor]] = {}
        self.routers: list = []
        for c in chunks:
            for layer in _unwrap(c).decoder.layers:
                router = getattr(layer.mlp, "router", None)
                if router is not None:
                    self._watch_router(int(layer.layer_number) - 1, router)

    def _watch_router(self, layer: int, router) -> None:
        """The logits `router.gating` returns (an instance attribute for step 1 only, removed by
        `finish`), recorded as module output router[layer]; and what the router decided from them."""
        gating = router.gating
        seen: dict[str, torch.Tensor] = {}

        def recorded_gating(hidden):
            logits = gating(hidden)
            if replaying():
                return logits
            shaped = logits.view(*hidden.shape[:-1], -1)  # [s/TP, b, E]
            micro = self.calls[f"{ROUTER}[{layer}]"]
            self._record(f"{ROUTER}[{layer}]", shaped)
            if micro == 0 and self.layout.dp_rank == 0:
                seen["logits"] = shaped.detach().float().clone()
            return logits

        def decided(module, args, out):
            probs, routing_map = out[0], out[1]
            if "logits" in seen and layer not in self.routing:
                shape = seen["logits"].shape
                self.routing[layer] = {"logits": seen.pop("logits"), "map": routing_map.detach().view(shape),
                                       "probs": probs.detach().float().view(shape)}

        router.gating = recorded_gating
        self.routers.append(router)
        self.handles.append(router.register_forward_hook(decided))

    # ---------------------------------------------------------------- forward

    def _width(self, base: str) -> int:
        if base == "attn":
            return self.model.num_heads * self.model.head_dim
        if base == "logits":
            return self.vocab_rows
        if base == ROUTER:
            return self.model.num_experts
        return self.model.channels

    def _record(self, name: str, out: torch.Tensor) -> None:
        if replaying():
            return
        micro = self.calls[name]
        self.calls[name] += 1
        if self.layout.dp_rank != 0 or micro >= MAX_MICRO_BATCHES:
            return
        t = out.detach().float()
        if micro == 0:
            self.order.append(name)
            if self.request.full:
                # A copy: megatron's vocab-parallel cross entropy turns the FP32 logits into softmax in place.
                self.whole[name] = t.clone()
                return
        self._share(micro_name(name, micro), name.split("[")[0], t)

    def _share(self, key: str, base: str, t: torch.Tensor) -> None:
        """This rank's share of an output's sketch, indexed in the canonical (b, s, h) layout."""
        S, B = self.case.seq_len, t.shape[1]
        s_local, h_local = t.shape[0], t.shape[-1]
        width = self._width(base)
        tp, tp_rank = self.layout.tp, self.layout.tp_rank
        true_width = self.model.vocab_size if base == "logits" else width
        s0 = tp_rank * s_local if s_local * tp == S and tp > 1 else 0
        h0 = tp_rank * h_local if h_local * tp == width and tp > 1 else 0
        if s0 == 0 and h0 == 0 and tp_rank != 0 and s_local == S and h_local == width:
            return  # replicated over TP: TP rank 0 holds it for all
        rows = self.request.rows
        if rows is not None:
            t = t[:, :rows]
            B = min(B, rows)
        dev = t.device
        s = torch.arange(s_local, device=dev, dtype=torch.int64).view(-1, 1, 1) + s0
        b = torch.arange(t.shape[1], device=dev, dtype=torch.int64).view(1, -1, 1)
        h = torch.arange(h_local, device=dev, dtype=torch.int64).view(1, 1, -1) + h0
        index = (b * S + s) * true_width + h
        keep = (h < true_width).expand_as(index)
        values, index = t[keep], index[keep]
        numel = B * S * true_width
        self.shares[key] = (sketch_torch(values, numel=numel, index=index),
                            float(values.double().pow(2).sum().item()), (B, S, true_width))

    # ---------------------------------------------------------------- after the backward

    def _routing_decisions(self, builder: CaptureBuilder, gather_tp) -> None:
        """Each MoE layer's router decisions on micro batch 0 of DP rank 0, in the canonical (b, t)
        order, into `builder` on TP rank 0 (capture/routing.py): the chosen experts from the routing
        map, highest logit first; their weights from the probabilities; the layer's load-balancing
        loss of the whole micro batch as megatron-core computes it (its own functions, coefficient 1).
        Under sequence parallelism each TP rank routed its part of the sequence: the parts are
        gathered first (a collective of the DP rank's TP group)."""
        from megatron.core.transformer.moe import moe_utils

        if self.layout.dp_rank != 0 or not self.routing:
            return
        k, E = self.model.router_topk, self.model.num_experts
        for layer in sorted(self.routing):  # the same order on every TP rank: gathers pair up
            seen = self.routing[layer]
            whole = {what: torch.cat(gather_tp(t.contiguous()), dim=0) if self.layout.tp > 1 else t
                     for what, t in (("logits", seen["logits"]), ("map", seen["map"].to(torch.uint8)),
                                     ("probs", seen["probs"]))}
            if self.layout.tp_rank != 0:
                continue
            logits, chosen, probs = (whole[w].transpose(0, 1) for w in ("logits", "map", "probs"))  # [b, s, E]
            experts = ranked_experts(logits, chosen.bool(), k)
            flat = logits.reshape(-1, E)
            aux_map, scores = moe_utils.compute_routing_scores_for_aux_loss(flat, k, "softmax")
            aux = moe_utils.switch_load_balancing_loss_func(scores, aux_map.sum(dim=0), flat.shape[0], k, E, 1.0)
            add_routing(builder, layer, experts, probs.gather(-1, experts), aux)

    def gather_tp(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every TP rank's piece of `t` (a collective of this rank's TP group)."""
        from megatron.core import parallel_state

        if self.layout.tp == 1:
            return [t]
        pieces = [torch.empty_like(t) for _ in range(self.layout.tp)]
        dist.all_gather(pieces, t.contiguous(), group=parallel_state.get_tensor_model_parallel_group())
        return pieces

    def canonical(self, of) -> dict[str, torch.Tensor]:
        """`of(parameter)` of every parameter of this rank's chunks under canonical names, TP pieces
        gathered (a collective), as the first copies this rank sends (`weights.first_copies`)."""
        from lockstep.runners.megatron import model as mmodel
        from lockstep.runners.megatron import weights as mweights

        layout, out = self.layout, {}
        for chunk in self.chunks:
            module = _unwrap(chunk)
            shard = mweights.ChunkShard(rank=layout.rank, tp_rank=layout.tp_rank, tp_size=layout.tp,
                                        pre_process=module.pre_process, post_process=module.post_process,
                                        layers=mmodel.chunk_layers(module), vocab_rows=self.vocab_rows,
                                        ep_rank=layout.ep_rank, ep_size=layout.ep, lora=self.case.lora)
            got = mweights.canonical_from_chunk({n: of(p) for n, p in module.named_parameters()}, self.model, shard,
                                                self.adapter, self.gather_tp)
            out.update(mweights.first_copies(got, layout, self.adapter))
        return out

    def finish(self, results: list, write: bool = True) -> None:
        """Gradients and losses read, shares sent to rank 0, the capture written there (unless
        `write` is False: `finish_applied` adds the optimizer's update after its step and writes it;
        `keep_weights` must then be called before that step)."""
        for h in self.handles:
            h.remove()
        for router in self.routers:
            del router.gating  # the class's method again
        layout = self.layout
        builder = CaptureBuilder(self.request, self.framework)
        whole = self._whole_outputs()
        grads = self._gradient_entries()
        self._routing_decisions(builder, self.gather_tp)
        losses, token_losses, step_loss = self._losses(results)
        shares = {k: (v.cpu().numpy(), n2, shape) for k, (v, n2, shape) in self.shares.items()}
        mine = {"whole": whole if layout.dp_rank == 0 else {}, "order": self.order, "shares": shares,
                "grads": grads, "losses": losses, "token_losses": token_losses,
                "routing": dict(builder.capture.routing) if layout.tp_rank == 0 else {}}
        if layout.world == 1:
            everyone = [mine]  # no pickling of a 1B model's gradients through a collective to itself
        else:
            everyone = [None] * layout.world if layout.rank == 0 else None
            dist.gather_object(mine, everyone, dst=0)
        if layout.rank != 0:
            return
        _assemble(builder, everyone)
        cap = builder.capture
        cap.loss = float(step_loss.item())
        cap.meta = {"case": self.case.to_dict(), "tp": layout.tp, "pp": layout.pp, "dp": layout.dp, "vpp": layout.vpp}
        self.builder = builder
        if write:
            builder.finish()

    def _whole_outputs(self) -> dict[str, np.ndarray]:
        """The recorded whole forward outputs, TP pieces gathered, [B, T, ...] as the capture holds them."""
        whole: dict[str, np.ndarray] = {}
        for name, t in sorted(self.whole.items()):  # the same order on every TP rank: gathers pair up
            if name.split("[")[0] in TP_SPLIT_OUTPUTS:
                t = torch.cat(self.gather_tp(t), dim=-1)
            if name == "logits":
                t = t[..., : self.model.vocab_size]
            t = t.transpose(0, 1)
            if self.request.rows is not None:
                t = t[: self.request.rows]
            whole[name] = t.cpu().numpy()
        return whole

    def _gradient_entries(self) -> dict[str, object]:
        """This rank's gradients under canonical names: whole ("grad/") or sketched ("sk/grad/"), and the
        sketch of Adam's first update where the request names its eps."""
        entries: dict[str, object] = {}
        grads = self.canonical(lambda p: (p.main_grad if getattr(p, "main_grad", None) is not None
                                          else torch.zeros_like(p)).detach().float())
        for name, g in grads.items():
            if self.request.full:
                entries[f"grad/{name}"] = g.cpu().numpy()
            else:
                entries[f"sk/grad/{name}"] = make_sketch(g)
            if self.request.adam_eps is not None:
                entries[f"sk/update/{name}"] = make_sketch(adam_first_update(g, self.request.adam_eps))
        return entries

    def _losses(self, results: list) -> tuple[list, np.ndarray | None, torch.Tensor]:
        """(the micro batches' logged losses, the token losses (one DP rank), the step's loss summed over ranks)."""
        layout = self.layout
        losses, token_losses = [], None
        if layout.reports_loss and layout.dp_rank == 0:
            losses = [logged_micro_loss(r) for r in results]
            if layout.dp == 1:
                token_losses = np.stack([r["lm loss tokens"][0].detach().float().cpu().numpy().reshape(-1)
                                         for r in results])
        step_share = 0.0
        if layout.reports_loss:
            step_share = sum(logged_micro_loss(r) for r in results) / len(results) / layout.dp
        step_loss = torch.tensor([step_share], dtype=torch.float64, device=layout.device)
        dist.all_reduce(step_loss)
        return losses, token_losses, step_loss

    # ---------------------------------------------------------------- the optimizer's update

    def keep_weights(self) -> None:
        """The weights before the optimizer's step (in FP64, as this rank sends them)."""
        self.before = {n: w.double() for n, w in self.canonical(lambda p: p.detach().float()).items()}

    def finish_applied(self, lr: float, step: int) -> None:
        """After the optimizer's step: the update it applied, (w_before - w_after)/lr per canonical
        tensor, sketched as `applied/NAME` with the bound on its relative error that w_after's FP32
        rounding allows (2^-24·||w_after||/lr over ||update||, as the reference's capture bounds its
        own), sent to rank 0, which writes the capture (a collective)."""
        from lockstep.capture.request import applied_update, zero_lr_note

        mine, precision = {}, {}
        for name, after in self.canonical(lambda p: p.detach().float()).items():
            moved, precision[name] = applied_update(self.before.pop(name), after.double(), lr)
            mine[f"{APPLIED}/{name}"] = make_sketch(moved)
        everyone = [(mine, precision)]
        if self.layout.world > 1:
            everyone = [None] * self.layout.world if self.layout.rank == 0 else None
            dist.gather_object((mine, precision), everyone, dst=0)
        if self.layout.rank != 0:
            return
        cap = self.builder.capture
        bounds: dict[str, float] = {}
        for sketches, part in everyone:
            for key, sketch in sketches.items():
                cap.sketches.setdefault(key, sketch)
            for name, bound in part.items():
                bounds.setdefault(name, bound)
        cap.meta[APPLIED] = {"step": step, "lr": lr, "precision": bounds}
        if lr == 0:
            cap.notes.append(zero_lr_note(step))
        self.builder.finish()


def _assemble(builder: CaptureBuilder, everyone: list[dict]) -> None:
    """Rank 0: every rank's part into one capture: whole outputs (first copy), sketch shares summed over ranks,
    gradients, the micro batches' losses, token losses and routing decisions."""
    cap = builder.capture
    summed: dict[str, list] = {}
    for part in everyone:
        for name, value in part["whole"].items():
            cap.forward.setdefault(name, value)
        for key, (values, norm2, shape) in part["shares"].items():
            if key in summed:
                summed[key][0] = summed[key][0] + values
                summed[key][1] += norm2
            else:
                summed[key] = [values, norm2, shape]
        for key, value in part["grads"].items():
            if key.startswith("grad/"):
                cap.grads.setdefault(key[len("grad/"):], value)
            else:
                cap.sketches.setdefault(key[len("sk/"):], value)
        _add_micro_losses(builder, part["losses"])
        if part["token_losses"] is not None:
            cap.token_losses = part["token_losses"]
        for name, value in part["routing"].items():
            cap.routing.setdefault(name, value)
    for key, (values, norm2, shape) in summed.items():
        cap.sketches[f"fwd/{key}"] = Sketch(values, float(np.sqrt(norm2)), shape)
    names = set(cap.forward) | {k[len("fwd/"):] for k in cap.sketches if k.startswith("fwd/") and "@" not in k}
    cap.forward_order = sorted(names, key=forward_rank)


def _add_micro_losses(builder: CaptureBuilder, losses: list) -> None:
    for micro, loss in enumerate(losses):
        if micro == 0:
            builder.add("fwd", "loss", np.array(loss))
        elif micro < MAX_MICRO_BATCHES:
            builder.capture.sketches[f"fwd/{micro_name('loss', micro)}"] = Sketch(np.array([loss]), abs(loss), ())
