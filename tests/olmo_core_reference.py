"""OLMo-core itself as the tests' reference: the config.json its runs save, and the batches its loader yields.

Only tests import this, and only where `olmo_core` is installed (they skip first otherwise).
`experiment_config` builds OLMo-core's own `ExperimentConfig` (a tiny model; the data sections as given), and
`save_config_json` writes it as OLMo-core's `ConfigSaverCallback` does (`json.dumps(config.as_config_dict())`).
`drive_loader` builds the dataset and the data loader through OLMo-core's config classes and iterates them the
way its `Trainer` does (`reshuffle(epoch)`, a `BatchSizeSchedulerCallback.pre_load_batch()` before every batch,
`reset()` after each epoch), per rank.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from olmo_core.data import NumpyDataLoaderConfig, TokenizerConfig
from olmo_core.nn.transformer import TransformerConfig
from olmo_core.optim import AdamWConfig
from olmo_core.script_utils import ExperimentConfig
from olmo_core.train import Duration, TrainerConfig
from olmo_core.train.callbacks import BatchSizeSchedulerCallback
from olmo_core.train.train_module import TransformerTrainModule, TransformerTrainModuleConfig

VOCAB, EOS, PAD = 2048, 0, 1  # the demo tokenizer's (tests/conftest.py)


def tokenizer_config() -> Any:
    return TokenizerConfig(vocab_size=VOCAB, eos_token_id=EOS, pad_token_id=PAD)


def experiment_config(
    dataset: Any,
    *,
    global_batch_size: int,
    seed: int,
    work_dir: str | None,
    save_folder: str,
    batch_sizes: list[int] | None = None,
    schedule: list[Any] | None = None,
) -> Any:
    """An OLMo-core ExperimentConfig around `dataset` (a NumpyDatasetConfig), as its training scripts build one."""
    sequence_length = dataset.sequence_length
    trainer = TrainerConfig(save_folder=save_folder, max_duration=Duration.epochs(4))
    if batch_sizes:
        trainer = trainer.with_callback(
            "batch_size_scheduler", BatchSizeSchedulerCallback(batch_sizes=batch_sizes, schedule=schedule or [])
        )
    return ExperimentConfig(
        model=TransformerConfig.llama_like(d_model=32, vocab_size=VOCAB, n_layers=1, n_heads=2),
        dataset=dataset,
        data_loader=NumpyDataLoaderConfig(global_batch_size=global_batch_size, seed=seed, work_dir=work_dir),
        train_module=TransformerTrainModuleConfig(
            rank_microbatch_size=global_batch_size, max_sequence_length=sequence_length, optim=AdamWConfig(lr=1e-3)
        ),
        trainer=trainer,
    )


def save_config_json(config: Any, folder: Path) -> str:
    """Write config.json as OLMo-core's ConfigSaverCallback writes it into each checkpoint folder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.json"
    path.write_text(json.dumps(config.as_config_dict()))
    return str(path)


@dataclass
class CoreStep:
    """What one rank's loader yielded at one step: instance numbers, input ids, label and instance masks."""

    step: int
    epoch: int
    index: np.ndarray
    input_ids: np.ndarray
    label_mask: np.ndarray | None
    instance_mask: np.ndarray | None
    doc_lens: list[np.ndarray] | None = None  # per row, its doc_lens without the collator's zero padding


def _stub_train_module() -> Any:
    """A TransformerTrainModule with only an optimizer, for the batch-size callback's learning-rate update."""
    module = object.__new__(TransformerTrainModule)
    module.optim = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    module.scheduler = None
    return module


def drive_loader(
    config: Any, *, world_size: int, last_step: int, monkeypatch: pytest.MonkeyPatch
) -> dict[int, list[CoreStep]]:
    """Per rank, the batches OLMo-core's loader yields for steps 1..last_step, driven as its Trainer drives it."""
    import olmo_core.data.data_loader as loader_module

    dataset = config.dataset.build()
    out: dict[int, list[CoreStep]] = {}
    for rank in range(world_size):
        monkeypatch.setattr(loader_module, "get_world_size", lambda group=None: world_size)
        monkeypatch.setattr(loader_module, "get_rank", lambda group=None, rank=rank: rank)
        loader = config.data_loader.build(dataset)
        assert loader.dp_rank == rank and loader.dp_world_size == world_size
        callbacks = []
        trainer = types.SimpleNamespace(
            data_loader=loader,
            global_step=0,
            global_train_tokens_seen=0,
            epoch=1,
            train_module=_stub_train_module(),
            callbacks={},
            max_duration=config.trainer.max_duration,
        )
        for cb in config.trainer.callbacks.values():
            if isinstance(cb, BatchSizeSchedulerCallback):
                cb = BatchSizeSchedulerCallback(batch_sizes=list(cb.batch_sizes), schedule=list(cb.schedule))
                cb.trainer = trainer  # type: ignore[assignment]
                cb.post_attach()
                callbacks.append(cb)
        steps: list[CoreStep] = []
        while trainer.global_step < last_step:
            loader.reshuffle(trainer.epoch)
            batches = iter(loader)
            while trainer.global_step < last_step:  # Trainer._iter_batches: callbacks first, then the batch
                for cb in callbacks:
                    cb.pre_load_batch()
                batch = next(batches, None)
                if batch is None:
                    break
                trainer.global_step += 1
                trainer.global_train_tokens_seen += loader.global_num_tokens_in_batch(batch)
                mask, keep = batch.get("label_mask"), batch.get("instance_mask")
                lens = batch.get("doc_lens")
                steps.append(
                    CoreStep(
                        trainer.global_step,
                        trainer.epoch,
                        batch["index"].numpy().astype(np.int64),
                        batch["input_ids"].numpy().astype(np.int64),
                        mask.numpy().astype(bool) if mask is not None else None,
                        keep.numpy().astype(bool) if keep is not None else None,
                        [row[row > 0].astype(np.int32) for row in lens.numpy()] if lens is not None else None,
                    )
                )
            trainer.epoch += 1  # the epoch is over (or the last step reached, and this no longer matters)
            loader.reset()
        out[rank] = steps
    return out


def global_rows(per_rank: dict[int, list[CoreStep]], step: int, field: str) -> np.ndarray:
    """A step's global batch from its ranks' parts: rank r held positions r, r + W, ..."""
    world = len(per_rank)
    parts = [getattr(per_rank[r][step - 1], field) for r in range(world)]
    out = np.empty((sum(len(p) for p in parts),) + parts[0].shape[1:], dtype=parts[0].dtype)
    for r, part in enumerate(parts):
        out[r::world] = part
    return out
