"""Known defects the numerics tests inject to prove that their comparisons can fail.

Each defect patches lockstep (or megatron-core) at run time, through the model-family seam
(`FAMILIES["gpt2"]` pointing at a defective subclass of the reference GPT-2) or a module
attribute, never by editing source. In the test process a defect goes in through pytest's
`monkeypatch` (`inject(name, monkeypatch)`), so it is undone after the test; in torchrun
workers through `worker_env(name)`: the workers' entry points call
`lockstep.runners.test_plugins.apply_test_plugins`, which imports this module (tests/ on
PYTHONPATH) and calls `from_env`, which applies LOCKSTEP_TEST_DEFECT for the worker's life.

The defects are the ones issue 16's audit found hidden under the contract's lr 1e-4:
- exact_gelu: erf GELU instead of GPT-2's tanh approximation (forward only; ~1e-3 relative);
- frozen_layernorm: the optimizer never updates the LayerNorm weights and biases;
- transposed_bias_grad: c_attn's and c_fc's bias gradients read as (k x C) transposed, the
  shape of InfiniTrain's CUDA column-reduction bug;
- broken_tie: the head trains as its own copy of wte (the tie lost, as on InfiniTrain CUDA);
- lnf_input_grad_term: ln_f's backward passes on a wrong input gradient (InfiniTrain CUDA's LayerNorm
  defect at lnf): with a LoRA case's frozen base, the LoRA B gradients below it are all that show it;
- data_order_off_by_one: every micro batch starts one micro batch (B*T tokens) late;
- megatron_pp_tie_unsynced: megatron's first and last pipeline stages stop all-reducing the
  tied word-embedding gradient (the head's gradient never reaches wte);
- megatron_tp_input_grad_unreduced: megatron's column-parallel layers stop all-reducing their
  input gradient over TP ranks (each rank back-propagates only its slice);
- megatron_layernorm_bias_grad_5pct: every LayerNorm bias gradient in megatron's workers is 5% too
  large -- the InfiniTrain CPU defect build's fault, which the loss at the contract's lr hides and
  the step-1 certificate must name;
- megatron_batched_p2p: the megatron runner's pipeline p2p batched for every layout, as it was
  on CUDA before issue 22 (with PP=2 and VPP, megatron-core then swaps activations and gradients
  in the interleaved schedule's two-way exchanges).

The reference's step with torch's own treatment of a parameter without a gradient
(tests/runners/test_mixtral_unrouted_experts.py's negative control):
- reference_skips_unrouted_experts: no zero gradient for a trainable parameter the backward left
  without one, so torch's Adam skips an expert no token was routed to (no moment decay, no update,
  its own step count not incremented), as the reference did before the contract said otherwise.

The lr schedule's negative control (tests/runners/test_lr_schedule_training.py):
- lr_warmup_one_step_late: the pytorch reference trains step n at the contract's lr of step n - 1
  (step 1 at step 1's), its warm-up one step late; the comparison's lr check must name step 2.

A schedule defect that shows from a saved state (diagnose --at-step's schedule control,
`inject_late_schedule(case, patch)`): pytorch-fast's Adam takes step t+1 (its state's count t)
at the contract's lr of step t, as a scheduler restored one step behind would.

A defect that shows only after step 1 (`lockstep diagnose --at-step`'s negative control):
- fast_adam_bias_correction_step1: pytorch-fast's Adam bias-corrects every update as if it were
  the first (1 - beta^1 instead of 1 - beta^t), its step count otherwise kept: step 1 is exactly
  right, every later update is too large (llama3's betas: ~1.9x at step 6).

Mixtral (MoE) routing defects, the certificate's negative controls (tests/runners/test_megatron_mixtral.py),
each of the reference through the family seam (FAMILIES["mixtral"]) unless named megatron_:
- mixtral_router_unrenormalised: routing weights are the full softmax's top-k probabilities, not
  renormalised over the k chosen (the experts chosen stay the same);
- mixtral_ties_to_higher_index: among equal router logits the higher expert index wins;
- mixtral_aux_loss_doubled: the load-balancing loss computed twice too large;
- mixtral_expert3_grad_scaled: expert 3's three matrices get 1.1 times their gradient, every layer;
- megatron_expert3_grad_scaled: the same in megatron's workers (its local expert 3, EP=1);
- megatron_ep_not_in_config: megatron's TransformerConfig without expert_model_parallel_size (the grid
  still has EP): expert parameters stay `allreduce=True`, so at EP=2 each rank's local expert j is
  summed with the other rank's, as the runner's first EP attempt did (the loss alone misses it).

LoRA defects, the certificate's LoRA negative controls (tests/certify/test_lora_findings.py,
tests/runners/test_lora_training.py), each in the pytorch reference unless named megatron_:
- lora_scale_alpha: the adapters' branch scaled by alpha instead of alpha / rank;
- lora_b_not_zero: the LoRA init's B drawn N(0, 0.01²) instead of zeros (A as the init has it);
- lora_wrong_module: a target `attn.c_proj` adapts mlp.c_fc instead (the other targets as given);
- lora_layernorm_trains: the reference's LoRA leaves every ln_1 weight trainable, and its optimizer
  takes them beside the adapters;
- megatron_lora_layernorm_trains: megatron's LoRA leaves every input LayerNorm weight trainable
  (so its optimizer updates a frozen parameter).

Broken resumes of the pytorch reference (the resume judge's negative controls, compare/resume.py):
each loads the checkpoint as the trainer does, then damages what it loaded:
- resume_data_restarted: the data stream starts again at batch 0 after the load;
- resume_moments_zeroed: Adam's exp_avg and exp_avg_sq are zeroed after the load;
- resume_step_reset: Adam's step count is set back to 0 after the load;
- resume_rank0_only: under DP, only rank 0 keeps what it loaded; the other ranks keep the
  weights they were built with and a fresh optimizer (in torchrun workers: worker_env).
Broken resumes of the megatron runner (its workers: worker_env), loading as it does, then:
- megatron_resume_data_restarted: the data position is restored as 0 (batch 0 read again);
- megatron_resume_step_reset: torch Adam's step count of every parameter set back to 0;
- megatron_resume_rank0_only: under DP, only DP rank 0 keeps what it loaded; the other replicas
  keep the weights they were built with and a fresh optimizer.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from lockstep.models.gpt2.model import GPT2, LN_EPS, MLP
from support.model_defects import ExtraTermLayerNorm

DEFECT_ENV = "LOCKSTEP_TEST_DEFECT"
TESTS_DIR = Path(__file__).resolve().parents[1]


class ExactGeluMLP(MLP):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.gelu(self.c_fc(x)))  # approximate="none": the defect


class ExactGeluGPT2(GPT2):
    def __init__(self, cfg):
        super().__init__(cfg)
        for blk in self.h:
            blk.mlp.__class__ = ExactGeluMLP


class FrozenLayerNormGPT2(GPT2):
    """LayerNorm parameters get no gradient, so SGD skips them: a frozen parameter group."""

    @classmethod
    def from_llmc(cls, tensors, cfg):
        model = super().from_llmc(tensors, cfg)
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.requires_grad_(False)
                module.bias.requires_grad_(False)
        return model


class FinalLayerNormInputGradGPT2(GPT2):
    """ln_f's backward adds a term to its input gradient (its forward and its own parameter gradients
    unchanged): InfiniTrain's CUDA GPT-2 LayerNorm defect at lnf, which every gradient below it inherits."""

    @classmethod
    def from_llmc(cls, tensors, cfg):
        model = super().from_llmc(tensors, cfg)
        extra = ExtraTermLayerNorm(cfg.channels, eps=LN_EPS)
        extra.load_state_dict(model.ln_f.state_dict())
        model.ln_f = extra
        return model


def _transposed(k: int):
    def hook(grad: torch.Tensor) -> torch.Tensor:
        return grad.reshape(k, -1).t().reshape(-1)

    return hook


class TransposedBiasGradGPT2(GPT2):
    def __init__(self, cfg):
        super().__init__(cfg)
        for blk in self.h:
            blk.attn.c_attn.bias.register_hook(_transposed(3))
            blk.mlp.c_fc.bias.register_hook(_transposed(4))


class BrokenTieGPT2(GPT2):
    """The head is a second parameter, a copy of wte at load time, trained on its own."""

    @classmethod
    def from_llmc(cls, tensors, cfg):
        model = super().from_llmc(tensors, cfg)
        model.lm_head = torch.nn.Parameter(model.wte.weight.detach()[: cfg.vocab_size].clone())
        return model

    def forward(self, idx, targets=None):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.ln_f(x) @ self.lm_head.t()
        return logits, None


def unrenormalised_route(logits: torch.Tensor, topk: int):
    experts = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :topk]
    return experts, F.softmax(logits.float(), dim=-1).gather(-1, experts).to(logits.dtype)


def higher_index_route(logits: torch.Tensor, topk: int):
    flipped = torch.sort(logits.flip(-1), dim=-1, descending=True, stable=True).indices[:, :topk]
    experts = logits.shape[-1] - 1 - flipped
    return experts, F.softmax(logits.gather(-1, experts).float(), dim=-1).to(logits.dtype)


def _mixtral(route=None, expert_grad=None):
    """A Mixtral reference subclass with another routing rule, or one expert's gradients scaled."""
    from lockstep.models.mixtral.model import Mixtral

    class DefectiveMixtral(Mixtral):
        def __init__(self, cfg):
            super().__init__(cfg)
            for blk in self.h:
                if route is not None:
                    blk.mlp.route = route
                if expert_grad is not None:
                    expert, scale = expert_grad
                    for p in blk.mlp.experts[expert].parameters():
                        p.register_hook(lambda g, scale=scale: g * scale)

    return DefectiveMixtral


MIXTRAL_DEFECTS = {"mixtral_router_unrenormalised": dict(route=unrenormalised_route),
                   "mixtral_ties_to_higher_index": dict(route=higher_index_route),
                   "mixtral_expert3_grad_scaled": dict(expert_grad=(3, 1.1))}


def _class_name(defect: str) -> str:
    return "".join(part.title() for part in defect.split("_"))


# The defective Mixtral classes at module level: the family seam names them "module:Class".
for _defect, _kw in MIXTRAL_DEFECTS.items():
    globals()[_class_name(_defect)] = _mixtral(**_kw)


REFERENCE_DEFECTS = {"exact_gelu": ExactGeluGPT2, "frozen_layernorm": FrozenLayerNormGPT2,
                     "transposed_bias_grad": TransposedBiasGradGPT2, "broken_tie": BrokenTieGPT2,
                     "lnf_input_grad_term": FinalLayerNormInputGradGPT2}
RESUME_DEFECTS = ("resume_data_restarted", "resume_moments_zeroed", "resume_step_reset", "resume_rank0_only")
MEGATRON_RESUME_DEFECTS = ("megatron_resume_data_restarted", "megatron_resume_step_reset", "megatron_resume_rank0_only")
LORA_DEFECTS = ("lora_scale_alpha", "lora_b_not_zero", "lora_wrong_module", "lora_layernorm_trains",
                "megatron_lora_layernorm_trains")
OTHER_DEFECTS = (*LORA_DEFECTS, "data_order_off_by_one", "megatron_pp_tie_unsynced", "megatron_tp_input_grad_unreduced",
                 "megatron_layernorm_bias_grad_5pct", "megatron_batched_p2p", *RESUME_DEFECTS, *MEGATRON_RESUME_DEFECTS,
                 *MIXTRAL_DEFECTS, "mixtral_aux_loss_doubled", "megatron_expert3_grad_scaled",
                 "megatron_ep_not_in_config", "reference_skips_unrouted_experts")
AFTER_STEP1_DEFECTS = ("fast_adam_bias_correction_step1",)
LR_DEFECTS = ("lr_warmup_one_step_late",)
DEFECTS = (*REFERENCE_DEFECTS, *OTHER_DEFECTS, *AFTER_STEP1_DEFECTS, *LR_DEFECTS)


class _Forever:
    """monkeypatch's setattr/setitem for a worker process: nothing is undone."""

    @staticmethod
    def setattr(target, name, value):
        setattr(target, name, value)

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def inject(name: str, patch) -> None:
    """Apply defect `name` with `patch` (pytest's monkeypatch, or _Forever in a worker)."""
    if name in REFERENCE_DEFECTS:
        from lockstep.models import FAMILIES

        cls = REFERENCE_DEFECTS[name]
        family = dataclasses.replace(FAMILIES["gpt2"], reference=f"{__name__}:{cls.__name__}")
        patch.setitem(FAMILIES, "gpt2", family)
    elif name in MIXTRAL_DEFECTS:
        from lockstep.models import FAMILIES

        family = dataclasses.replace(FAMILIES["mixtral"], reference=f"{__name__}:{_class_name(name)}")
        patch.setitem(FAMILIES, "mixtral", family)
    elif name == "mixtral_aux_loss_doubled":
        from lockstep.models.mixtral import model as mixtral_model

        right = mixtral_model.switch_aux_loss
        patch.setattr(mixtral_model, "switch_aux_loss", lambda routing, num_experts: 2 * right(routing, num_experts))
    elif name == "megatron_expert3_grad_scaled":
        from megatron.core.transformer.moe import experts

        built = experts.SequentialMLP.__init__

        def init_with_scaled_expert(self, *args, **kwargs):
            built(self, *args, **kwargs)
            if len(self.local_experts) > 3:
                for p in self.local_experts[3].parameters():
                    p.register_hook(lambda g: g * 1.1)

        patch.setattr(experts.SequentialMLP, "__init__", init_with_scaled_expert)
    elif name == "megatron_ep_not_in_config":
        from lockstep.runners.megatron import model

        right = model.transformer_config

        def without_ep(*args, **kwargs):
            config = right(*args, **kwargs)
            config.expert_model_parallel_size = 1
            return config

        patch.setattr(model, "transformer_config", without_ep)
    elif name == "reference_skips_unrouted_experts":
        from lockstep.runners.pytorch import step as reference_step

        patch.setattr(reference_step, "zero_missing_gradients", lambda optimizer: 0)
    elif name == "fast_adam_bias_correction_step1":
        from lockstep.runners.pytorch_fast import train as fast

        right = fast.build_fast_optimizer
        patch.setattr(fast, "build_fast_optimizer",
                      lambda *args, **kwargs: bias_corrected_as_step1(right(*args, **kwargs)))
    elif name == "lr_warmup_one_step_late":
        from lockstep.runners.pytorch import train

        right = train.lr_at
        patch.setattr(train, "lr_at", lambda case, step: right(case, max(step - 1, 1)))
    elif name in LORA_DEFECTS:
        _inject_lora(name, patch)
    elif name == "data_order_off_by_one":
        from lockstep.data import loader

        right = loader.window_start

        def late(case, step, micro_step, dp_rank):
            return right(case, step, micro_step, dp_rank) + case.micro_batch * case.seq_len

        patch.setattr(loader, "window_start", late)
    elif name == "megatron_pp_tie_unsynced":
        import importlib

        finalize = importlib.import_module("megatron.core.distributed.finalize_model_grads")
        patch.setattr(finalize, "_allreduce_word_embedding_grads", lambda *args, **kwargs: None)
    elif name == "megatron_tp_input_grad_unreduced":
        from megatron.core.tensor_parallel import layers

        built = layers.ColumnParallelLinear.__init__

        def init_without_dgrad_reduce(self, *args, **kwargs):
            built(self, *args, **kwargs)
            # No all-reduce of the input gradient, neither inside the linear's backward nor
            # through copy_to_tensor_model_parallel_region: each TP rank keeps its partial sum.
            self.allreduce_dgrad = False
            self.disable_grad_reduce = True

        patch.setattr(layers.ColumnParallelLinear, "__init__", init_without_dgrad_reduce)
    elif name == "megatron_layernorm_bias_grad_5pct":
        built = torch.nn.LayerNorm.__init__

        def init_with_wrong_bias_grad(self, *args, **kwargs):
            built(self, *args, **kwargs)
            if self.bias is not None:
                self.bias.register_hook(lambda g: g * 1.05)

        patch.setattr(torch.nn.LayerNorm, "__init__", init_with_wrong_bias_grad)
    elif name in RESUME_DEFECTS:
        # The module's attribute, which the trainer calls (a torchrun worker runs train.py as __main__).
        from lockstep.runners.pytorch import checkpoint

        patch.setattr(checkpoint, "load_training_state", _broken_load(name, checkpoint.load_training_state))
    elif name in MEGATRON_RESUME_DEFECTS:
        # The module's attribute, which the megatron worker calls at the resume.
        from lockstep.runners.megatron import checkpoint

        patch.setattr(checkpoint, "load_training_state", _broken_megatron_load(name, checkpoint.load_training_state))
    elif name == "megatron_batched_p2p":
        from lockstep.runners.megatron import model

        patch.setattr(model, "pipeline_p2p", lambda case: model.PipelineP2P(batch=True, overlap=False))
    else:
        raise ValueError(f"unknown defect {name!r}; known: {', '.join(DEFECTS)}")


def inject_late_schedule(case, patch) -> None:
    """pytorch-fast's Adam one step behind `case`'s lr schedule (see the module docstring)."""
    from lockstep.runners.pytorch_fast import train as fast

    right = fast.build_fast_optimizer
    patch.setattr(fast, "build_fast_optimizer",
                  lambda *args, **kwargs: lr_one_step_late(right(*args, **kwargs), case))


def lr_one_step_late(optimizer: torch.optim.Optimizer, case) -> torch.optim.Optimizer:
    """`optimizer` (torch's Adam) whose step t+1 trains at the contract's lr of step t."""
    from lockstep.cases.lr_schedule import lr_at

    step = optimizer.step

    def late_step(*args, **kwargs):
        counts = [int(state["step"]) for state in optimizer.state.values() if "step" in state]
        taken = max(counts, default=0)
        if taken:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(case, taken)
        return step(*args, **kwargs)

    optimizer.step = late_step
    return optimizer


def bias_corrected_as_step1(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` (torch's Adam) whose every step bias-corrects as step 1 does: each parameter's
    step count is set to 0 before the step (which counts it to 1 and corrects with 1 - beta^1) and
    to its true count after."""
    step = optimizer.step

    def step_as_if_first(*args, **kwargs):
        counts = [(state["step"], state["step"].clone()) for state in optimizer.state.values() if "step" in state]
        for count, _ in counts:
            count.zero_()
        result = step(*args, **kwargs)
        for count, was in counts:
            count.copy_(was + 1)
        return result

    optimizer.step = step_as_if_first
    return optimizer


def _inject_lora(name: str, patch) -> None:
    if name == "megatron_lora_layernorm_trains":
        from lockstep.runners.megatron import lora as megatron_lora

        right = megatron_lora.apply_lora

        def leaves_layernorm_trainable(chunk, *args, **kwargs):
            count = right(chunk, *args, **kwargs)
            for layer in chunk.decoder.layers:
                layer.input_layernorm.weight.requires_grad_(True)
            return count

        patch.setattr(megatron_lora, "apply_lora", leaves_layernorm_trainable)
        return
    from lockstep.runners.pytorch import train

    right_apply, right_init = train.apply_lora, train.lora_init_tensors
    if name == "lora_scale_alpha":
        def apply_scaled_by_alpha(model, spec):
            adapters = right_apply(model, spec)
            for layer in adapters.layers.values():
                layer.scale = layer.alpha
            return adapters

        patch.setattr(train, "apply_lora", apply_scaled_by_alpha)
    elif name == "lora_layernorm_trains":
        from lockstep.models.lora import LoraAdapters

        class WithLayerNorms(LoraAdapters):
            def parameters(self):
                return super().parameters() + self.extra

        def apply_leaving_layernorms(model, spec):
            adapters = right_apply(model, spec)
            extra = [blk.ln_1.weight.requires_grad_(True) for blk in model.h]
            out = WithLayerNorms(adapters.layers)
            object.__setattr__(out, "extra", extra)
            return out

        patch.setattr(train, "apply_lora", apply_leaving_layernorms)
    elif name == "lora_b_not_zero":
        def init_with_b(family, config, spec, seed):
            rng = np.random.default_rng(seed)
            return {n: (rng.normal(0.0, 0.01, v.shape).astype(np.float32) if n.startswith("lora_B") else v)
                    for n, v in right_init(family, config, spec, seed).items()}

        patch.setattr(train, "lora_init_tensors", init_with_b)
    elif name == "lora_wrong_module":
        def moved(spec):
            return dataclasses.replace(spec, target_modules=tuple("mlp.c_fc" if t == "attn.c_proj" else t
                                                                  for t in spec.target_modules))

        patch.setattr(train, "apply_lora", lambda model, spec: right_apply(model, moved(spec)))
        patch.setattr(train, "lora_init_tensors", lambda family, config, spec, seed: right_init(family, config,
                                                                                               moved(spec), seed))


def _broken_load(name: str, load):
    def broken(plan, model, optimizer):
        if plan.data_step is not None or plan.optimizer is not None:
            return load(plan, model, optimizer)  # the judge's what-if alternatives stay as they are
        if name == "resume_rank0_only":
            import torch.distributed as dist

            built = [p.detach().clone() for p in model.parameters()]
            shift = load(plan, model, optimizer)  # collective: every rank takes part
            if dist.get_rank() != 0:
                with torch.no_grad():
                    for p, b in zip(model.parameters(), built):
                        p.copy_(b)
                optimizer.state.clear()
            return shift
        shift = load(plan, model, optimizer)
        if name == "resume_data_restarted":
            return -plan.step  # the loop's step N reads step 0's window
        for state in optimizer.state.values():
            if name == "resume_moments_zeroed":
                state["exp_avg"].zero_()
                state["exp_avg_sq"].zero_()
            else:
                state["step"].zero_()
        return shift

    return broken


def _broken_megatron_load(name: str, load):
    def broken(plan, chunks, optimizer, scheduler, layout, zero):
        if name == "megatron_resume_rank0_only":
            params = [p for c in chunks for p in c.parameters()]
            built = [p.detach().clone() for p in params]
            shift = load(plan, chunks, optimizer, scheduler, layout, zero)  # collective: every rank takes part
            if layout.dp_rank != 0:
                with torch.no_grad():
                    for p, b in zip(params, built):
                        p.copy_(b)
                for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
                    sub.optimizer.state.clear()
            return shift
        shift = load(plan, chunks, optimizer, scheduler, layout, zero)
        if name == "megatron_resume_data_restarted":
            return -plan.step  # the loop's step N reads step 0's window
        for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
            for state in sub.optimizer.state.values():
                state["step"].zero_()
        return shift

    return broken


def from_env() -> None:
    """The torchrun workers' plugin: apply LOCKSTEP_TEST_DEFECT for this process's life."""
    inject(os.environ[DEFECT_ENV], _Forever)


def worker_env(name: str, monkeypatch) -> None:
    """Make every torchrun worker started from now on (in this test) apply defect `name`."""
    monkeypatch.setenv("LOCKSTEP_TEST_PLUGINS", f"{__name__}:from_env")
    monkeypatch.setenv(DEFECT_ENV, name)
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS_DIR), path) if p))
