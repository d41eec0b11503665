"""A stage-2 run in the view: the Stages page lists the stage it grew from, and a stage-1 document's page shows the
stage-1 steps up to the checkpoint handed on (`trace` across stages), not linked (this view serves stage 2's own
steps only). The checkpoint is a fake (its config and trainer state), all the data side reads of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from olmo_data.dataset.instances import open_from_config
from olmo_data.dataset.order import build_config_orders
from olmo_view import RunAnswers
from olmo_view.pages_trace import document_page, stages_page
from tests.view.conftest import GBS, SEQ, ViewRun

PARENT_STEP = 12


def _config(path: Path, data: list[str], name: str, folder: Path, **kw: object) -> dict:
    cfg = {
        "run_name": name,
        "seed": kw.pop("seed", 3),
        "save_folder": str(folder),
        "global_train_batch_size": GBS,
        "max_duration": kw.pop("max_duration", 36),
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": data},
        **kw,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    build_config_orders(str(path))
    return cfg


def test_a_stage_2_run_shows_its_stage_1(view_run: ViewRun, tmp_path: Path) -> None:
    data = yaml.safe_load(Path(view_run.config).read_text())["data"]["paths"]
    text, noise = data
    cfg1 = _config(tmp_path / "stage1.yaml", [text], "stage1", tmp_path / "run1")
    ckpt = tmp_path / "run1" / f"step{PARENT_STEP}"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text(yaml.safe_dump(cfg1))
    state = {
        "step": PARENT_STEP,
        "tokens_seen": PARENT_STEP * GBS * SEQ,
        "run_name": "stage1",
        "data_fingerprint": open_from_config(cfg1).fingerprint(),
        "seed": 3,
        "global_train_batch_size": GBS,
        "sequence_length": SEQ,
    }
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    folder = tmp_path / "run2"
    _config(folder / "config.yaml", [noise], "stage2", folder, seed=5, load_path=str(ckpt),
            restore_dataloader=False, max_duration=10)  # fmt: skip
    (folder / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "train/loss": 3.0}) + "\n" for s in range(1, 11))
    )
    answers = RunAnswers(str(folder))

    stages = stages_page(answers).decode()
    assert re.search(r"<td>1</td><td>checkpoint</td><td>stage1</td>.*?<td>1\.\.12</td>", stages)
    assert f"{(10 * GBS + PARENT_STEP * GBS) * SEQ:,} tokens trained in all stages" in stages

    page = document_page(answers, "passage", 1).decode()
    assert "this run: stage2" in page and "stage 1: stage1" in page
    steps = [int(s) for s in re.findall(r"<tr><td>(\d+)</td><td>\d+</td>", page)]  # stage 1's, as text
    assert steps and max(steps) <= PARENT_STEP
    assert 'href="/step/' not in page.split("stage 1: stage1", 1)[1]
