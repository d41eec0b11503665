"""A small run for the view's tests, made in seconds without training: two tokenized sources (words, and noise
that makes a spike), a built order, and the records a trainer leaves (metrics.jsonl with the batch fingerprints
inspect-batch rebuilds, losses per source, z-loss and learning rate; instance_loss.bin in its documented row
format). One document holds markup that would run script if a page did not escape it; its id does too."""

from __future__ import annotations

import json
import math
import random
import string
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

from olmo_data.dataset.order import build_config_orders
from olmo_data.run.batches import inspect_batch
from olmo_data.run.instance_loss import ROW
from olmo_data.run.layout import INSTANCE_LOSS as FILE_NAME
from tests.helpers import write_jsonl

GBS, SEQ, STEPS = 8, 32, 36
WORDS = "the model reads a line of text and learns which word comes next in it".split()
PASSAGE = "Quartz jugs vex the plumbing wizard while seven lazy owls hum under crimson lanterns at dawn."
XSS_TEXT = 'before <script>alert(1)</script> middle <img src=x onerror=alert(1)> after "quoted" & done. '
XSS_ID = "xss-<img src=x onerror=alert(1)>"


@dataclass
class ViewRun:
    folder: Path
    config: str
    spike_step: int
    noisy: list[int]  # positions of the noise instances at the spike


def _rows(source: str, texts: list[str], prefix: str) -> list[dict[str, str]]:
    return [{"id": f"{prefix}-{i}", "text": t, "source": source} for i, t in enumerate(texts)]


@pytest.fixture(scope="session")
def view_run(demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> ViewRun:
    from olmo_data.tokenize import TokenizeOptions, tokenize

    root = tmp_path_factory.mktemp("view")
    rng = random.Random(7)
    text = _rows("text", [" ".join(rng.choices(WORDS, k=110)) for _ in range(64)], "text")
    text.insert(10, {"id": "passage", "text": PASSAGE + " " + " ".join(rng.choices(WORDS, k=60)), "source": "text"})
    text.insert(20, {"id": XSS_ID, "text": XSS_TEXT * 6, "source": "text"})
    noise = _rows("noise", ["".join(rng.choices(string.ascii_letters, k=200)) for _ in range(12)], "noise")
    for name, rows in (("text", text), ("noise", noise)):
        tokenize([write_jsonl(root / f"{name}.jsonl", rows)], root / name, TokenizeOptions(tokenizer=demo_tokenizer))
    folder = root / "run"
    folder.mkdir()
    config = str(folder / "config.yaml")
    cfg = {
        "run_name": "view-test",
        "seed": 3,
        "save_folder": str(folder),
        "global_train_batch_size": GBS,
        "max_duration": STEPS,
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": [str(root / "text"), str(root / "noise")]},
    }
    Path(config).write_text(yaml.safe_dump(cfg))
    build_config_orders(config)
    batches = [inspect_batch(config, step=s) for s in range(1, STEPS + 1)]
    is_noise = [np.array([i.path.startswith(str(root / "noise")) for i in b.instances]) for b in batches]
    spike = next(s for s in range(22, STEPS) if is_noise[s - 1].any())  # after spikes' 20-step window
    gen = np.random.default_rng(0)
    rows, records = [], []
    for s in range(1, STEPS + 1):
        noisy = is_noise[s - 1]
        per_token = 3.0 - 0.01 * s + gen.normal(0, 0.01, GBS)
        if s == spike:  # noise instances at 8 nats a token, the rest a little under the trend
            per_token = np.where(noisy, 8.0, 2.6)
        tokens = np.full(GBS, SEQ - 1)
        for p in range(GBS):
            rows.append((s, p, tokens[p], per_token[p] * tokens[p]))
        record = {
            "step": s,
            "train/loss": float(per_token.mean()),
            "train/z_loss": 1e-4 * float(per_token.mean()),
            "optim/lr": 1e-3 * min(1.0, s / 5) * 0.5 * (1 + math.cos(math.pi * s / STEPS)),
            "train/batch_fingerprint": batches[s - 1].batch_fingerprint,
        }
        for label, which in (("text", ~noisy), ("noise", noisy)):
            if which.any():
                record[f"train/source/{label}/loss"] = float(per_token[which].mean())
        records.append(json.dumps(record, sort_keys=True))
    np.array(rows, dtype=ROW).tofile(folder / FILE_NAME)
    (folder / "metrics.jsonl").write_text("\n".join(records) + "\n")
    return ViewRun(folder, config, spike, np.flatnonzero(is_noise[spike - 1]).tolist())
