"""Per-instance and per-source losses of real runs (tiny model, CPU, gloo), checked against `transformers`.

Two sources: real text (the demo corpus) and noise (documents of random characters). After a 2-process run, the
loss `inspect-batch --json` shows for each instance of a step is the cross-entropy `transformers` computes for that
instance with the exported weights of the step before; their token-weighted mean is the logged train/loss, and so
is the per-source losses'. instance_loss.bin is the same after a kill and resume as in an unbroken run (bitwise on
one world size; to float rounding after 2 ranks then 1).
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from olmo_cli.main import main as olmo_data_cli
from olmo_data.config import load_config
from olmo_data.run.instance_loss import read_rows, step_losses
from olmo_data.run.layout import INSTANCE_LOSS as FILE_NAME
from olmo_data.run.layout import instance_loss_aside as aside_name
from olmo_data.run.spikes import find_spikes
from olmo_train.train import train
from tests.helpers import docs, write_jsonl
from tests.train.test_train_e2e import kill_during_save, launch

transformers = pytest.importorskip("transformers")

GBS, SEQ, STEPS = 8, 32, 4
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def data(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """[text directory, noise directory], both tokenized (with document metadata) by the demo tokenizer."""
    from olmo_data.tokenize import TokenizeOptions, tokenize

    root = tmp_path_factory.mktemp("sources")
    rng = random.Random(0)
    noise = ["".join(rng.choices(string.ascii_letters + string.digits, k=300)) for _ in range(40)]
    noise_docs = write_jsonl(root / "noise.jsonl.gz", docs(*noise, source="noise"))
    tokenize(demo_corpus[:1], root / "text", TokenizeOptions(tokenizer=demo_tokenizer))
    tokenize([noise_docs], root / "noise", TokenizeOptions(tokenizer=demo_tokenizer))
    return [str(root / "text"), str(root / "noise")]


def write_config(folder: Path, data: list[str], **overrides: Any) -> Path:
    cfg: dict[str, Any] = {
        "seed": 5,
        "save_folder": str(folder / "run"),
        "max_duration": STEPS,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": 2,
        "save_interval": 2,
        "distributed_strategy": "fsdp",
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 2048, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
        "data": {"paths": data},
        **overrides,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics(run: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


@pytest.fixture(scope="module")
def two_ranks(data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config of an unbroken 2-process run of STEPS steps."""
    config = write_config(tmp_path_factory.mktemp("two"), data)
    launch(config, 2)
    return config


def test_instance_losses_are_transformers_cross_entropy(two_ranks: Path, tmp_path: Path) -> None:
    from olmo_train.convert import export_hf

    run, step = two_ranks.parent / "run", 3
    hf_dir = export_hf(run / "step2", tmp_path / "hf")  # the weights step 3 trained from
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    out = CliRunner().invoke(olmo_data_cli, ["inspect-batch", str(two_ranks), "--step", str(step), "--json"])
    assert out.exit_code == 0, out.output
    instances = json.loads(out.output)["instances"]
    assert [i["position"] for i in instances] == list(range(GBS))
    with torch.no_grad():
        ids = torch.tensor([i["token_ids"] for i in instances])
        logits = hf(ids).logits[:, :-1].float()
        reference = F.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none").mean(-1)
    for inst, expected in zip(instances, reference.tolist(), strict=True):
        assert inst["supervised_tokens"] == SEQ - 1
        assert inst["loss"] == pytest.approx(expected, abs=1e-4), inst["position"]
    record = metrics(run)[step]
    tokens = np.array([i["supervised_tokens"] for i in instances])
    mean = float(np.dot([i["loss"] for i in instances], tokens) / tokens.sum())
    assert mean == pytest.approx(record["train/loss"], rel=1e-6)
    assert tokens.sum() == record["train/supervised_tokens"]
    by_source = {k.split("/")[2] for k in record if k.startswith("train/source/")}
    assert by_source == {"text", "noise"}
    weighted = sum(
        record[f"train/source/{s}/loss"] * record[f"train/source/{s}/supervised_tokens"]
        for s in by_source
        if record[f"train/source/{s}/supervised_tokens"]
    )
    assert weighted / tokens.sum() == pytest.approx(record["train/loss"], rel=1e-6)
    # sorted by loss: the same instances, highest loss first
    out = CliRunner().invoke(olmo_data_cli, ["inspect-batch", str(two_ranks), "--step", str(step), "--sort", "loss"])
    assert out.exit_code == 0, out.output
    shown = [float(line.split()[1]) for line in out.output.splitlines() if line.startswith("    loss: ")]
    assert shown == sorted(shown, reverse=True) and len(shown) == GBS


def test_every_step_of_the_run_is_recorded_once(two_ranks: Path) -> None:
    run = two_ranks.parent / "run"
    rows = read_rows(run / FILE_NAME)
    assert rows["step"].tolist() == [s for s in range(1, STEPS + 1) for _ in range(GBS)]
    assert rows["position"].tolist() == list(range(GBS)) * STEPS
    for step, record in metrics(run).items():
        got = step_losses(run / FILE_NAME, step)
        assert got is not None
        assert got.loss_sum.sum() / got.tokens.sum() == pytest.approx(record["train/loss"], rel=1e-6)


def test_elastic_restart_continues_the_file(two_ranks: Path, data: list[str], tmp_path: Path) -> None:
    """2 ranks to step 3, then 1 rank to the end: the rows of an unbroken 2-rank run, values to float rounding."""
    config = write_config(tmp_path, data, stop_at=3)
    launch(config, 2)
    assert train(load_config(config, ["--stop_at=null", "--distributed_strategy=single"])) == 0
    got, unbroken = read_rows(tmp_path / "run" / FILE_NAME), read_rows(two_ranks.parent / "run" / FILE_NAME)
    for key in ("step", "position", "tokens"):
        np.testing.assert_array_equal(got[key], unbroken[key])
    np.testing.assert_array_equal(got["loss_sum"][: 3 * GBS], unbroken["loss_sum"][: 3 * GBS])
    np.testing.assert_allclose(got["loss_sum"], unbroken["loss_sum"], rtol=1e-4)


def test_kill_and_resume_gives_the_unbroken_file(data: list[str], tmp_path: Path) -> None:
    """Killed inside the step-4 save (rows 1..4 written, checkpoint 4 not): the rerun resumes from step 2, sets the
    file aside and ends with exactly the unbroken run's bytes."""
    unbroken = write_config(tmp_path / "a", data, distributed_strategy="single")
    assert train(load_config(unbroken)) == 0
    config = write_config(tmp_path / "b", data, distributed_strategy="single")
    run = tmp_path / "b" / "run"
    assert train(load_config(config, ["--stop_at=2"])) == 0  # the save hook pauses at the run's first save
    kill_during_save(config, {"OLMO_TRAIN_TEST_SAVE_PAUSE": "120", "OLMO_TRAIN_TEST_SAVE_PAUSE_AT": "written"}, run)
    killed = (run / FILE_NAME).read_bytes()
    assert read_rows(run / FILE_NAME)["step"].max() == 4
    with (run / FILE_NAME).open("ab") as f:
        f.write(b"\x01\x02\x03")  # as if the kill had cut a row short
    assert train(load_config(config)) == 0
    assert (run / FILE_NAME).read_bytes() == (tmp_path / "a" / "run" / FILE_NAME).read_bytes()
    assert (run / aside_name(1)).read_bytes() == killed + b"\x01\x02\x03"


def test_spikes_of_a_real_run_add_up_to_the_jump(two_ranks: Path) -> None:
    """With a threshold every rise passes, each reported step's instance shares are (loss sum - baseline x tokens)
    / step tokens, computed here from inspect-batch's numbers."""
    report = find_spikes(str(two_ranks.parent / "run"), window=2, z=-100.0, top=GBS)
    assert [s.step for s in report.spikes] == list(range(3, STEPS + 1))
    for spike in report.spikes:
        out = CliRunner().invoke(olmo_data_cli, ["inspect-batch", str(two_ranks), "--step", str(spike.step), "--json"])
        instances = json.loads(out.output)["instances"]
        total = sum(i["supervised_tokens"] for i in instances)
        shares = {i["position"]: (i["loss"] - spike.baseline) * i["supervised_tokens"] / total for i in instances}
        assert {c.position for c in spike.contributors} == {p for p, v in shares.items() if v > 0}
        for c in spike.contributors:
            assert c.contribution == pytest.approx(shares[c.position], abs=1e-9)
            assert c.source in ("text", "noise") and c.documents
