"""`olmo-data spikes`: a spike injected into a run's records (the instances of a noise source jump at one step) is
found, and the instances named are exactly the noise ones of that step, with the documents inspect-batch gives."""

from __future__ import annotations

import json
import math
import random
import string
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main as olmo_data_cli
from olmo_data.dataset.order import build_config_orders
from olmo_data.errors import DataError
from olmo_data.run.batches import inspect_batch
from olmo_data.run.instance_loss import ROW
from olmo_data.run.layout import INSTANCE_LOSS as FILE_NAME
from olmo_data.run.spikes import find_spikes, format_spikes
from olmo_train.train.instance_losses import InstanceLossLog
from tests.helpers import docs, write_jsonl

GBS, SEQ = 8, 32
WORDS = "the model reads a line of text and learns which word comes next in it".split()


@pytest.fixture(scope="module")
def run(demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, list[int]]:
    """A save folder (config.yaml, order) with injected records: (folder, spike step, its noise positions)."""
    from olmo_data.tokenize import TokenizeOptions, tokenize

    root = tmp_path_factory.mktemp("spikes")
    rng = random.Random(1)
    text = [" ".join(rng.choices(WORDS, k=120)) for _ in range(60)]
    noise = ["".join(rng.choices(string.ascii_letters, k=200)) for _ in range(12)]
    for name, texts in (("text", text), ("noise", noise)):
        tokenize(
            [write_jsonl(root / f"{name}.jsonl", docs(*texts, source=name))],
            root / name,
            TokenizeOptions(tokenizer=demo_tokenizer),
        )
    folder = root / "run"
    folder.mkdir()
    cfg = {
        "seed": 3,
        "save_folder": str(folder),
        "global_train_batch_size": GBS,
        "model": {"max_sequence_length": SEQ},
        "data": {"paths": [str(root / "text"), str(root / "noise")]},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    build_config_orders(str(folder / "config.yaml"))
    step, noisy = 0, []
    for s in range(8, 60):  # the first step after the window whose batch holds noise instances
        report = inspect_batch(str(folder / "config.yaml"), step=s)
        noisy = [i.position for i in report.instances if i.path.startswith(str(root / "noise"))]
        if noisy:
            step = s
            break
    assert step, "no batch with noise instances"
    gen = np.random.default_rng(0)
    log = InstanceLossLog(folder / FILE_NAME, enabled=True)
    log.start(0)
    with (folder / "metrics.jsonl").open("w") as f:
        for s in range(1, step + 4):
            per_token = 3.0 + gen.normal(0, 0.01, GBS)
            if s == step:  # the spike: noise instances at 8 nats a token, the rest a little under the baseline
                per_token = np.where(np.isin(np.arange(GBS), noisy), 8.0, 2.9)
            tokens = np.full(GBS, SEQ - 1)
            log.write(s, per_token * tokens, tokens)
            fingerprint = inspect_batch(str(folder / "config.yaml"), step=s, decode=False).batch_fingerprint
            record = {"step": s, "train/loss": float(per_token.mean()), "train/batch_fingerprint": fingerprint}
            f.write(json.dumps(record, sort_keys=True) + "\n")  # as the trainer writes it
    log.close()
    return folder, step, noisy


def test_the_injected_spike_and_its_documents(run: tuple[Path, int, list[int]]) -> None:
    folder, step, noisy = run
    report = find_spikes(str(folder), window=5, z=4.0, top=GBS)
    assert [s.step for s in report.spikes] == [step]
    spike = report.spikes[0]
    assert sorted(c.position for c in spike.contributors) == sorted(noisy)
    assert sum(c.contribution for c in spike.contributors) > spike.loss - spike.baseline  # the rest pull it down
    batch = {i.position: i for i in inspect_batch(str(folder / "config.yaml"), step=step).instances}
    for c in spike.contributors:
        assert c.source == "noise" and c.loss == pytest.approx(8.0)
        assert c.documents == batch[c.position].documents and c.documents
        assert all(d.src.endswith("noise.jsonl") for d in c.documents)
    out = CliRunner().invoke(olmo_data_cli, ["spikes", str(folder), "--window", "5", "--z", "4"])
    assert out.exit_code == 0, out.output
    assert f"step {step}: loss" in out.output and "(source noise)" in out.output
    assert repr(spike.contributors[0].documents[0].id) in out.output  # type: ignore[index]
    out = CliRunner().invoke(olmo_data_cli, ["spikes", str(folder / "config.yaml"), "--window", "5", "--json"])
    assert json.loads(out.output)["spikes"][0]["step"] == step


def test_bad_runs_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=f"{tmp_path}/nope: not found; give a run's save folder"):
        find_spikes(str(tmp_path / "nope"))
    with pytest.raises(DataError, match=f"{tmp_path}: no config.yaml in it"):
        find_spikes(str(tmp_path))
    with pytest.raises(DataError, match="--window 1: the baseline needs at least 2 earlier steps"):
        find_spikes(str(tmp_path), window=1)
    (tmp_path / "config.yaml").write_text("save_folder: x\n")
    out = CliRunner().invoke(olmo_data_cli, ["spikes", str(tmp_path)])
    assert out.exit_code == 2 and f"error: {tmp_path}/metrics.jsonl: not found" in out.output


def test_inspect_batch_sorts_by_the_recorded_loss(run: tuple[Path, int, list[int]]) -> None:
    folder, step, noisy = run
    config = str(folder / "config.yaml")
    out = CliRunner().invoke(olmo_data_cli, ["inspect-batch", config, "--step", str(step), "--sort", "loss"])
    assert out.exit_code == 0, out.output
    heads = [line for line in out.output.splitlines() if line.startswith("[")]
    assert [int(h[1 : h.index("]")]) for h in heads[: len(noisy)]] == sorted(noisy)  # 8 nats first, by position
    assert out.output.count(f"    loss: 8.0000 over {SEQ - 1} supervised tokens (at this step)") == len(noisy)
    out = CliRunner().invoke(olmo_data_cli, ["inspect-batch", config, "--step", str(step + 10), "--sort", "loss"])
    assert out.exit_code == 2
    assert f"error: --sort loss: no per-instance losses for step {step + 10} (the save folder has no" in out.output
    report = inspect_batch(config, step=step + 10)  # without --sort: the batch, without losses
    assert report.loss_record is None and all(i.loss is None for i in report.instances)


def test_losses_of_another_runs_batches_are_never_shown(run: tuple[Path, int, list[int]], tmp_path: Path) -> None:
    """A config that names the run's save folder but builds other batches (here another seed) must not be shown that
    run's losses beside its own instances: refused, naming both fingerprints. Where the run's metrics hold no batch
    fingerprint for the step, nothing can be checked, and no loss is shown."""
    folder, step, _ = run
    other = yaml.safe_load((folder / "config.yaml").read_text())
    other.update(seed=4, save_folder=str(tmp_path / "other"))
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    build_config_orders(str(tmp_path / "other.yaml"))
    refused = rf"trained another batch at step {step} \(fingerprint [0-9a-f]+ in its metrics"
    with pytest.raises(DataError, match=refused):
        inspect_batch(str(tmp_path / "other.yaml"), step=step, save_folder=str(folder))
    same = inspect_batch(str(folder / "config.yaml"), step=step)
    assert same.loss_record is not None and all(i.loss is not None for i in same.instances)
    unchecked = tmp_path / "unchecked"
    unchecked.mkdir()
    (unchecked / FILE_NAME).write_bytes((folder / FILE_NAME).read_bytes())
    (unchecked / "metrics.jsonl").write_text(json.dumps({"step": step, "train/loss": 3.0}) + "\n")
    bare = inspect_batch(str(folder / "config.yaml"), step=step, save_folder=str(unchecked))
    assert bare.loss_record is None and all(i.loss is None for i in bare.instances)


def write_metrics(folder: Path, lines: list[dict[str, object]]) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "config.yaml").write_text("save_folder: x\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_a_non_finite_loss_is_a_spike_and_stays_out_of_the_baseline(tmp_path: Path) -> None:
    """Step 8 diverges (NaN) and step 20 is inf; step 15 is a real spike, which a NaN in the baseline hid."""
    gen = np.random.default_rng(0)
    losses = {s: 3.0 + float(gen.normal(0, 0.01)) for s in range(1, 25)}
    losses[8], losses[15], losses[20] = math.nan, 5.0, math.inf
    write_metrics(tmp_path, [{"step": s, "train/loss": v} for s, v in losses.items()])
    report = find_spikes(str(tmp_path), window=5, z=10)
    assert [s.step for s in report.spikes] == [8, 15, 20]
    finite = [v for s, v in sorted(losses.items()) if s < 15 and math.isfinite(v)]
    assert report.spikes[1].baseline == pytest.approx(float(np.mean(finite[-5:])), rel=1e-12)
    text = format_spikes(report)
    assert "step 8: loss nan" in text and "not a finite number" in text
    as_json = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert [(s["step"], s["finite"]) for s in as_json["spikes"]] == [(8, False), (15, True), (20, False)]


def test_records_without_a_step_are_skipped(tmp_path: Path) -> None:
    lines: list[dict[str, object]] = [{"eval/on_start": 1.0, "train/loss": 9.0}]
    lines += [{"step": s, "train/loss": 3.0 + 0.01 * (s % 3)} for s in range(1, 12)]
    lines.append({"step": 12, "train/loss": 6.0})
    write_metrics(tmp_path, lines)
    report = find_spikes(str(tmp_path), window=5, z=10)
    assert (report.steps, [s.step for s in report.spikes]) == (12, [12])


@pytest.mark.parametrize("z", ["nan", "inf", "-1", "0"])
def test_a_threshold_that_is_no_number_of_deviations_is_refused(run: tuple[Path, int, list[int]], z: str) -> None:
    folder, _, _ = run
    out = CliRunner().invoke(olmo_data_cli, ["spikes", str(folder), "--z", z])
    assert out.exit_code == 2 and out.output.count("\n") == 1, out.output
    assert f"error: --z {float(z)}: expected a positive, finite number" in out.output


def test_inspect_batch_json_never_prints_bare_infinity(run: tuple[Path, int, list[int]], tmp_path: Path) -> None:
    """A diverged instance's loss is inf: --json writes null (Python's json would write the non-JSON `Infinity`)."""
    import shutil

    folder, step, noisy = run
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    rows = np.memmap(copy / "instance_loss.bin", dtype=ROW, mode="r+")
    rows["loss_sum"][(rows["step"] == step) & (rows["position"] == noisy[0])] = np.inf
    rows.flush()
    del rows
    args = ["inspect-batch", str(folder / "config.yaml"), "--step", str(step), "--save-folder", str(copy), "--json"]
    out = CliRunner().invoke(olmo_data_cli, args)
    assert out.exit_code == 0, out.output

    def refuse(token: str) -> None:
        raise AssertionError(f"{token} is not JSON")

    report = json.loads(out.stdout, parse_constant=refuse)
    losses = {i["position"]: i["loss"] for i in report["instances"]}
    assert losses[noisy[0]] is None and losses[noisy[1]] == pytest.approx(8.0)
