"""A user's Hugging Face `Trainer` script: a tiny GPT-2 (causal LM) or BERT (masked LM) built
from a config (no download), trained on random tokens with `TrainingArguments` on the CPU.

    HF_HUB_OFFLINE=1 python hf_trainer.py --steps 20
    HF_HUB_OFFLINE=1 python hf_trainer.py --model bert --accumulate 2   # gradient accumulation

`--steps` is `max_steps`: optimizer steps, each of `--accumulate` micro-batches.
"""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=20, help="optimizer steps (max_steps)")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--fail-at", type=int, default=-1)
parser.add_argument("--model", choices=("gpt2", "bert"), default="gpt2")
parser.add_argument("--accumulate", type=int, default=1, help="gradient_accumulation_steps")
parser.add_argument("--seq-len", type=int, default=32)
args = parser.parse_args()

VOCAB = 512


class RandomTokens(Dataset):
    """Random token sequences; the labels are the inputs (the model shifts them itself)."""

    def __init__(self, n: int, seq_len: int):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, VOCAB, (n, seq_len), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones_like(self.ids[i]),
                "labels": self.ids[i]}


class FailAt(TrainerCallback):
    def on_step_begin(self, args_, state, control, **kwargs):
        if state.global_step == args.fail_at:
            raise RuntimeError(f"hf_trainer.py: failing at step {state.global_step} as asked")


torch.manual_seed(0)
if args.model == "gpt2":
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=args.seq_len, n_embd=64,
                                       n_layer=2, n_head=2))
else:
    model = BertForMaskedLM(BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, intermediate_size=128,
                                       max_position_embeddings=args.seq_len))
with tempfile.TemporaryDirectory() as out:
    training_args = TrainingArguments(
        output_dir=out, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        gradient_accumulation_steps=args.accumulate, learning_rate=5e-4, warmup_steps=2,
        lr_scheduler_type="linear", max_grad_norm=1.0, logging_steps=5, save_strategy="no",
        report_to="none", use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training_args,
                      train_dataset=RandomTokens(args.batch_size * args.accumulate * 8,
                                                 args.seq_len),
                      callbacks=[FailAt()])
    result = trainer.train()
print(f"trained {trainer.state.global_step} steps, loss {result.training_loss:.4f}")
