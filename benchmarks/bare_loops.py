"""Bare training loops: the same model, data and shapes as a lockstep case, with nothing of
lockstep's harness around the loop (no run record, no log lines, no per-step callbacks, no
per-step loss read-back). What `benchmarks/harness_overhead.py` divides lockstep's tok/s by.

    python benchmarks/bare_loops.py torch    --case gpt2_1 --checkpoint CKPT --tokens TOKENS [--device cuda]
    python benchmarks/bare_loops.py megatron --case gpt2_1 --checkpoint CKPT --tokens TOKENS [--megatron-step plain]

Building the model and the data uses lockstep's own pieces (the reference module; megatron-core's
GPTModel, DDP, optimizer and GPTDataset as lockstep's megatron runner configures them), so both
sides train the same thing; only the loop is bare. Each step is timed as docs/reference/training-contract.md#timing says
(synchronize, start; data, forward, loss, backward, gradient communication, optimizer step;
synchronize, stop), so the two are timed alike. One device only (the single-GPU cases).

`--megatron-step no-norm` (default) steps megatron-core's optimizer as lockstep does
(prepare_grads + step_with_ready_grads: step() without the gradient norm clip_grad 0 leaves
unused); `plain` calls optimizer.step() as Megatron-LM's train_step does (norm included).
Prints one JSON object: per-step ms and tok/s, median tok/s over steps 2..N, the last loss.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time
from typing import Callable

import torch
import torch.nn.functional as F

from lockstep.cases.matrix import load_matrix, select_cases
from lockstep.cases.spec import CaseSpec


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ieee_fp32() -> None:
    """The contract's FP32: TF32 off (lockstep's runners set the same)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def torch_step_fn(case: CaseSpec, checkpoint: str, tokens: str, device: torch.device) -> Callable[[int], torch.Tensor]:
    """The reference model and optimizer in a plain loop body; returns step(i) -> detached loss."""
    import numpy as np

    from lockstep.formats.tokens import read_token_stream
    from lockstep.models import family as model_family
    from lockstep.models import load_checkpoint
    from lockstep.runners.pytorch.train import build_optimizer

    ckpt = load_checkpoint(checkpoint)
    fam = model_family(ckpt.family)
    model = fam.reference_class().from_llmc(ckpt.tensors, ckpt.config).to(device)
    optimizer = build_optimizer(fam.optimizer, model.parameters(), case.lr)
    stream = read_token_stream(tokens, check_ids=False).tokens
    n = case.micro_batch * case.seq_len

    def step(i: int) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = None
        for m in range(case.accum):
            p = (i * case.accum + m) * n
            buf = torch.from_numpy(np.asarray(stream[p: p + n + 1], dtype=np.int64))
            x = buf[:-1].view(case.micro_batch, case.seq_len).to(device, non_blocking=True)
            y = buf[1:].view(case.micro_batch, case.seq_len).to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=case.is_bf16):
                logits, _ = model(x)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.view(-1))
            (loss / case.accum).backward()
        optimizer.step()
        return loss.detach()

    return step


def megatron_step_fn(case: CaseSpec, checkpoint: str, tokens: str, device: torch.device,
                     optimizer_step: str = "no-norm") -> Callable[[int], torch.Tensor]:
    """megatron-core set up as lockstep's megatron runner sets it up, stepped by a bare loop body."""
    from megatron.core import tensor_parallel
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from lockstep.models import family as model_family
    from lockstep.models import load_checkpoint
    from lockstep.models.family import split_canonical
    from lockstep.runners.megatron import dataset as mdata
    from lockstep.runners.megatron import model as mmodel
    from lockstep.runners.megatron import weights as mweights
    from lockstep.runners.megatron.cpu_shims import apply_cpu_shims
    from lockstep.runners.megatron.families import adapter_for
    from lockstep.runners.megatron.job import DATA_SEED, MODEL_SEED
    from lockstep.runners.megatron.parallel import init_parallel
    from lockstep.runners.megatron.worker import make_forward_step, optimizer_step as no_norm_step, padded_vocab_mask

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    on_cpu = device.type != "cuda"
    ckpt = load_checkpoint(checkpoint)
    fam = model_family(ckpt.family)
    adapter = adapter_for(ckpt.config)
    precision = mmodel.Precision.for_case(case, False)
    layout = init_parallel(case, device.type)
    if on_cpu:
        apply_cpu_shims()
    else:
        tensor_parallel.model_parallel_cuda_manual_seed(MODEL_SEED)
    vocab_rows = adapter.vocab_rows(ckpt.config, case.tp)
    config = mmodel.transformer_config(case, ckpt.config, adapter, precision, on_cpu)
    chunks = mmodel.build_model_chunks(config, ckpt.config, adapter, layout, vocab_rows)
    canonical = split_canonical(ckpt.tensors, ckpt.config)
    for chunk in chunks:
        if not on_cpu:
            chunk.cuda(layout.device)
        shard = mweights.ChunkShard(rank=layout.rank, tp_rank=layout.tp_rank, tp_size=layout.tp,
                                    pre_process=chunk.pre_process, post_process=chunk.post_process,
                                    layers=mmodel.chunk_layers(chunk), vocab_rows=vocab_rows)
        mweights.load_chunk(chunk, mweights.chunk_tensors(canonical, ckpt.config, shard, adapter), layout.rank)
    chunks = mmodel.wrap_for_training(config, chunks, precision)
    optimizer, scheduler = mmodel.build_optimizer(case, chunks, precision, fam.optimizer)
    config.no_sync_func = chunks[0].no_sync
    config.finalize_model_grads_func = finalize_model_grads
    config.grad_scale_func = optimizer.scale_loss
    indexed = mdata.ensure_indexed_dataset(tokens)
    dataset = mdata.build_gpt_dataset(indexed, case.seq_len, mdata.samples_needed(case), ckpt.config.vocab_size,
                                      seed=DATA_SEED)
    batches = mdata.MicroBatches(dataset, case, layout.dp_rank, layout.device)
    forward_step = make_forward_step(batches.attention_mask, padded_vocab_mask(vocab_rows, ckpt.config.vocab_size, layout))
    forward_backward = get_forward_backward_func()

    class Micro:
        def __init__(self, i):
            self.i, self.m = i, 0

        def __iter__(self):
            return self

        def __next__(self):
            batch = batches.micro_batch(self.i, self.m)
            self.m += 1
            return batch

    def step(i: int) -> torch.Tensor:
        chunks[0].zero_grad_buffer()
        optimizer.zero_grad()
        results = forward_backward(forward_step_func=forward_step, data_iterator=Micro(i), model=chunks,
                                   num_microbatches=case.accum, seq_length=case.seq_len,
                                   micro_batch_size=case.micro_batch, decoder_seq_length=case.seq_len,
                                   forward_only=False)
        if optimizer_step == "plain":
            optimizer.step()
        else:
            no_norm_step(optimizer)
        scheduler.step(increment=1)
        per_token, mask = results[-1]["lm loss tokens"]
        return (per_token * mask).sum() / mask.sum()

    return step


def run_bare(step: Callable[[int], torch.Tensor], case: CaseSpec, device: torch.device) -> dict:
    times, losses = [], []
    for i in range(case.steps):
        synchronize(device)
        t0 = time.perf_counter()
        losses.append(step(i))
        synchronize(device)
        times.append(time.perf_counter() - t0)
    rates = [case.total_batch / t for t in times]
    measured = rates[1:] or rates
    return {"step_ms": [t * 1e3 for t in times], "tokens_per_s": rates,
            "median_tokens_per_s": statistics.median(measured),
            "last_loss": float(losses[-1]),  # read once, after the timed steps
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("framework", choices=["torch", "megatron"])
    p.add_argument("--matrix", default="gpt2")
    p.add_argument("--case", required=True)
    p.add_argument("--model", help="the case's model name for the record (shape comes from the checkpoint)")
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--tokens", required=True)
    p.add_argument("--steps", type=int)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--megatron-step", choices=["no-norm", "plain"], default="no-norm")
    args = p.parse_args(argv)
    case = select_cases(load_matrix(args.matrix), [args.case])[0]
    if args.steps:
        case = CaseSpec.from_dict({**case.to_dict(), "steps": args.steps})
    if case.world_size != 1:
        raise SystemExit(f"bare loops run single-device cases; {case.name} needs {case.world_size} devices")
    ieee_fp32()
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if args.framework == "torch":
        step = torch_step_fn(case, args.checkpoint, args.tokens, device)
    else:
        step = megatron_step_fn(case, args.checkpoint, args.tokens, device, args.megatron_step)
    result = run_bare(step, case, device)
    label = args.framework + (f" ({args.megatron_step})" if args.framework == "megatron" else "")
    print(json.dumps({"framework": label, "case": case.name, "steps": case.steps, **result}))
    if args.framework == "megatron":
        from lockstep.runners.megatron.parallel import shutdown

        shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
