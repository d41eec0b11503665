"""olmo_train: a compact trainer for OLMo-style models that reads its data only through `olmo_data`.

Modules, one per concept: config (dataclasses + overrides), model (the decoder), distributed (process group
and fsdp/ddp/single), data (steps to batches, via olmo_data.order), optim (AdamW and schedules), checkpoint
(sharded and unsharded, atomic, resumable on any world size), metrics (console, metrics.jsonl, wandb), train
(the loop).
"""
