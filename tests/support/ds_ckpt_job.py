"""A real DeepSpeed ZeRO-3 job that saves what `fleet checkpoints` audits (CPU, gloo, torchrun).

A tiny GPT-2 built from a config (no hub download) wrapped in a PEFT LoRA adapter on `c_attn`,
trained a few steps with torch.optim.AdamW (DeepSpeed's own optimizer would JIT-build an op);
stage3_param_persistence_threshold=0 so that even the LoRA tensors are partitioned, as a real
model's are. Then, on every node's local rank 0 (node-local output dirs):

    OUT/TAG/zero_pp_rank_R_mp_rank_00_{model,optim}_states.pt   engine.save_checkpoint (all ranks)
    OUT/latest, OUT/zero_to_fp32.py                             (the node of global rank 0 only)
    OUT/adapter/                         adapter gathered first (the seed's fix): a good adapter
    EXTRA/adapter-step1/                 gathered after step 1: good, but differs from OUT/adapter
    EXTRA/adapter-ungathered/            saved without gathering: every tensor has zero elements
    EXTRA/adapter-empty-dict/            save_pretrained(state_dict={}): a header and no tensors

    ds_ckpt_job.py --out OUT --extra EXTRA --tag TAG [--steps N]
"""

from __future__ import annotations

import argparse
import os

import deepspeed
import torch
from peft import LoraConfig, get_peft_model
from transformers import GPT2Config, GPT2LMHeadModel

VOCAB = 64
SEQ = 8


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB, n_positions=SEQ)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], lora_dropout=0.0)
    return get_peft_model(GPT2LMHeadModel(config), lora)


def save_adapter(engine: deepspeed.DeepSpeedEngine, path: str, gather: bool) -> None:
    """Every rank takes part (gathering is collective); each node's local rank 0 writes."""
    local = int(os.environ["LOCAL_RANK"]) == 0
    if not gather:
        if local:
            engine.module.save_pretrained(path, safe_serialization=True)
        return
    params = [p for n, p in engine.module.named_parameters() if "lora_" in n]
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        if local:
            engine.module.save_pretrained(path, safe_serialization=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra", required=True)
    ap.add_argument("--tag", default="global_step2")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    deepspeed.init_distributed(dist_backend="gloo")
    net = model()
    optimizer = torch.optim.AdamW([p for p in net.parameters() if p.requires_grad], lr=1e-2)
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    }
    engine, *_ = deepspeed.initialize(model=net, optimizer=optimizer, config=config)
    rank = torch.distributed.get_rank()
    gen = torch.Generator().manual_seed(rank)
    for step in range(1, args.steps + 1):
        ids = torch.randint(0, VOCAB, (1, SEQ), generator=gen)
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        if step == 1:
            save_adapter(engine, os.path.join(args.extra, "adapter-step1"), gather=True)
    engine.save_checkpoint(args.out, tag=args.tag)
    save_adapter(engine, os.path.join(args.out, "adapter"), gather=True)
    save_adapter(engine, os.path.join(args.extra, "adapter-ungathered"), gather=False)
    if int(os.environ["LOCAL_RANK"]) == 0:
        engine.module.save_pretrained(
            os.path.join(args.extra, "adapter-empty-dict"), state_dict={}, safe_serialization=True
        )
    torch.distributed.barrier()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
