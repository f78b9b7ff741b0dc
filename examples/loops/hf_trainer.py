"""A correct HF Trainer run: a tiny GPT-2 on sequences of different lengths, padded per batch, with
`per_device_train_batch_size` (per device, as the name says) and the token count averaged over the
devices (`average_tokens_across_devices=True`, the default in recent transformers): each token weighs
the same whichever rank it lands on.

    torchrun --nproc-per-node 2 examples/loops/hf_trainer.py --per-device 8
    python -m mgpu check-script examples/loops/hf_trainer.py --per-device "{16 // world_size}"
    python -m mgpu check-script examples/loops/hf_trainer.py --per-device "{16 // world_size}" --model llama --bf16

--model llama --bf16: a tiny Llama under `TrainingArguments(bf16=True)` (bfloat16 autocast around the
forward; weights, gradients and AdamW in float32; the gradient norm clipped at 1, a linear schedule).
"""

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments,
                          set_seed)

AVERAGE_TOKENS_ACROSS_DEVICES = True


class Sequences(Dataset):
    def __init__(self, n=256, vocab=100):
        g = torch.Generator().manual_seed(0)
        self.items = [torch.randint(1, vocab, (int(torch.randint(4, 24, (1,), generator=g)),), generator=g)
                      for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i]}


def collate(batch):
    """Pad to this batch's longest sequence; padding is ignored by the loss (-100)."""
    longest = max(len(e["input_ids"]) for e in batch)
    ids = torch.zeros(len(batch), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, e in enumerate(batch):
        ids[i, :len(e["input_ids"])] = e["input_ids"]
        mask[i, :len(e["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--per-device", type=int, default=8, help="per_device_train_batch_size")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--model", choices=["gpt2", "llama"], default="gpt2")
    parser.add_argument("--bf16", action="store_true", help="TrainingArguments(bf16=True): bfloat16 autocast")
    args = parser.parse_args()

    set_seed(0)
    if args.model == "llama":
        model = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=2, num_key_value_heads=2,
                                             max_position_embeddings=32))
    else:
        model = GPT2LMHeadModel(GPT2Config(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2))
    extra = ({"average_tokens_across_devices": AVERAGE_TOKENS_ACROSS_DEVICES}
             if "average_tokens_across_devices" in TrainingArguments.__dataclass_fields__ else {})
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, per_device_train_batch_size=args.per_device,
                                     max_steps=args.max_steps, learning_rate=1e-3, use_cpu=True, seed=0,
                                     dataloader_drop_last=True, report_to=[], save_strategy="no", logging_steps=10,
                                     bf16=args.bf16,
                                     **extra)
        Trainer(model=model, args=training, train_dataset=Sequences(), data_collator=collate).train()


if __name__ == "__main__":
    main()
