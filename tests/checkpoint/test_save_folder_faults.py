"""The fault matrix of save folders (issue 41), each case run through `olmo-train train` as a user runs it: a run
folder copied the way object storage and `cp -rL` copy it (`latest` a directory), a checkpoint of another model
shape in the folder, a damaged `.distcp` shard, and a launcher killed with SIGKILL. Each ends in one line naming
the file or folder (exit 2, no traceback, nothing new written), or, where the folder can be repaired with
certainty, in a resume that works."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from olmo_data.errors import DataError
from olmo_data.run import latest_checkpoint
from olmo_data.run.batches import inspect_batch
from olmo_train import checkpoint as ckpt

REPO = Path(__file__).resolve().parents[2]
SEQ = 32


def write_run_config(folder: Path, tokens: Path, **overrides: Any) -> Path:
    """A 1-process run of a tiny model on `tokens`, saving sharded and unsharded every 2 steps."""
    cfg: dict[str, Any] = {
        "run_name": "faults",
        "seed": 3,
        "save_folder": str(folder / "run"),
        "max_duration": 6,
        "global_train_batch_size": 8,
        "device_train_microbatch_size": 4,
        "save_interval": 2,
        "save_interval_unsharded": 2,
        "distributed_strategy": "single",
        "model": {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ},
        "optimizer": {"learning_rate": 0.01},
        "data": {"paths": [str(tokens)]},
    }
    for key, value in overrides.items():
        cfg[key] = value
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "olmo_cli.train_main", "train", str(config), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str], *names: str) -> str:
    """The run failed with exit 2 and one `error:` line naming each of `names`, and no traceback."""
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, out
    for name in names:
        assert name in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two finished-at-step-2 runs on the same tokens: the tiny model's (config, run) and one with d_model 64."""
    root = tmp_path_factory.mktemp("save_folder_faults")
    tokens = root / "tokens.npy"
    np.random.default_rng(0).integers(0, 256, 40 * SEQ).astype(np.uint16).tofile(tokens)
    (root / "small").mkdir()
    (root / "wide").mkdir()
    small = write_run_config(root / "small", tokens)
    wide = write_run_config(root / "wide", tokens)
    for config, extra in ((small, []), (wide, ["--model.d_model=64"])):
        proc = train(config, "--stop_at=2", *extra)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"config": small, "run": root / "small" / "run", "wide": root / "wide" / "run", "root": root}


def copy_following_links(src: Path, dst: Path) -> Path:
    """What `cp -rL`, `gsutil cp -r` and `aws s3 sync` make of a save folder: every link a copy of its target."""
    shutil.copytree(src, dst, symlinks=False)
    assert (dst / "latest").is_dir() and not (dst / "latest").is_symlink()
    return dst


def test_a_copied_latest_directory_is_read_as_a_copy_and_put_back_as_the_link(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """Every save after resuming such a folder ended in IsADirectoryError once the checkpoint was written, and
    `latest` stayed the stale copy. Now the readers skip the copy, and the first start replaces each copied
    directory by the link (it is verified to be a copy of the checkpoint it names) and saves on as usual."""
    copy = copy_following_links(runs["run"], tmp_path / "copy")
    assert (copy / "latest-unsharded").is_dir()
    # readers before any repair: the newest checkpoint is step2 itself, the batches are the run's
    assert latest_checkpoint(copy) == copy / "step2"
    batch = inspect_batch(str(copy / "config.yaml"), step=2).batch_fingerprint
    assert batch == inspect_batch(str(runs["run"] / "config.yaml"), step=2).batch_fingerprint
    proc = train(runs["config"], f"--save_folder={copy}", "--stop_at=4")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out and "IsADirectoryError" not in out
    assert f"{copy / 'latest'}: a copy of {copy / 'step2'}" in out and "replaced by the link" in out
    for link, target in (("latest", "step4"), ("latest-unsharded", "step4-unsharded")):
        assert (copy / link).is_symlink() and os.readlink(copy / link) == target
    assert sorted(p.name for p in copy.iterdir() if p.name.startswith((".tmp", ".replaced"))) == []
    steps = [json.loads(line)["step"] for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]


def test_a_copied_latest_directory_that_is_not_its_checkpoint_is_refused_and_left_alone(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    """`latest` holding another checkpoint's files (here the wide model's step 2) cannot be told from a newer
    copy someone made by hand: refused at start, naming it and what to do; nothing is removed or written."""
    copy = copy_following_links(runs["run"], tmp_path / "copy")
    shutil.rmtree(copy / "latest")
    shutil.copytree(runs["wide"] / "step2", copy / "latest")
    before = sorted(str(p.relative_to(copy)) for p in copy.rglob("*"))
    line = one_line_error(train(runs["config"], f"--save_folder={copy}", "--stop_at=4"), str(copy / "latest"))
    assert "not a copy of step2" in line and "move it out of the save folder" in line
    assert sorted(str(p.relative_to(copy)) for p in copy.rglob("*") if p.name != "writer.lock") == before


def test_a_latest_directory_whose_checkpoint_is_gone_takes_its_place(runs: dict[str, Path], tmp_path: Path) -> None:
    """A copy that kept `latest/` but not the step directory it named: the copy is the checkpoint, renamed."""
    copy = copy_following_links(runs["run"], tmp_path / "copy")
    shutil.rmtree(copy / "step2")
    ckpt.remove_stale_temporaries(copy)
    assert os.readlink(copy / "latest") == "step2"
    ckpt.check_files(copy / "step2")  # its files, checksums and metadata as written


@pytest.mark.parametrize("what", ["a file", "an incomplete copy", "the other kind"])
def test_other_things_where_latest_belongs_are_refused_by_name(
    runs: dict[str, Path], tmp_path: Path, what: str
) -> None:
    copy = copy_following_links(runs["run"], tmp_path / "copy")
    latest = copy / "latest"
    shutil.rmtree(latest)
    if what == "a file":
        latest.write_text("step2\n")
        expected = "a file, where the trainer keeps a link"
    elif what == "an incomplete copy":
        shutil.copytree(copy / "step2", latest)
        (latest / "trainer_state.json").unlink()
        expected = "a directory without trainer_state.json"
    else:
        shutil.copytree(copy / "step2-unsharded", latest)
        expected = "a copy of an unsharded checkpoint (step 2)"
    with pytest.raises(DataError) as e:
        ckpt.remove_stale_temporaries(copy)
    assert str(e.value).startswith(f"{latest}: {expected}"), e.value
    assert latest.exists() and not latest.is_symlink(), "a refused latest must be left as it is"


@pytest.mark.parametrize("kind", ["step2", "step2-unsharded"])
def test_a_checkpoint_of_another_model_shape_is_refused_naming_the_setting(
    runs: dict[str, Path], tmp_path: Path, kind: str
) -> None:
    """Resume ended in a distributed-checkpoint traceback (sharded) or a size-mismatch RuntimeError; another seed
    was refused in one line. Now the shape is too, naming the setting that differs and the first tensor."""
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copytree(runs["wide"] / kind, folder / kind)
    line = one_line_error(train(runs["config"], f"--save_folder={folder}", "--stop_at=4"), str(folder / kind))
    assert f"model.d_model is 64 in {folder / kind / 'config.yaml'}, 32 in the config" in line
    assert "is [256, 64] there, [256, 32] in this model" in line or "[64] there, [32] in this model" in line
    assert sorted(p.name for p in folder.iterdir()) == [kind], "a refused resume must write nothing"


def test_another_shape_without_a_recorded_config_names_the_tensor(runs: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "folder"
    folder.mkdir()
    shutil.copytree(runs["wide"] / "step2", folder / "step2")
    checksums = json.loads((folder / "step2" / "checksums.json").read_text())
    del checksums["files"]["config.yaml"]
    (folder / "step2" / "checksums.json").write_text(json.dumps(checksums))
    (folder / "step2" / "config.yaml").unlink()
    line = one_line_error(train(runs["config"], f"--save_folder={folder}", "--stop_at=4"), str(folder / "step2"))
    assert "a checkpoint of another model shape: tensor " in line and " in this model" in line


@pytest.mark.parametrize(
    "damage",
    ["garbage", "garbage, no checksums.json", "cut, no checksums.json", "model.pt garbage, no checksums.json"],
)
def test_a_damaged_shard_is_named_in_one_line(runs: dict[str, Path], tmp_path: Path, damage: str) -> None:
    """Garbage of the right length in a shard of a checkpoint without checksums.json ended in torch's 5-line
    unpickling message (advising an unsafe load); with checksums it is caught by them; cut, by the metadata; an
    unsharded checkpoint's model.pt likewise."""
    folder = tmp_path / "folder"
    folder.mkdir()
    kind = "step2-unsharded" if damage.startswith("model.pt") else "step2"
    shutil.copytree(runs["run"] / kind, folder / kind)
    shard = folder / kind / ("model.pt" if kind == "step2-unsharded" else "__0_0.distcp")
    size = shard.stat().st_size
    if "garbage" in damage:
        shard.write_bytes(np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8).tobytes())
    else:
        shard.write_bytes(shard.read_bytes()[: size // 2])
    if "no checksums" in damage:
        (folder / kind / "checksums.json").unlink()
    line = one_line_error(train(runs["config"], f"--save_folder={folder}", "--stop_at=4"), shard.name)
    unreadable = "(its bytes are not tensors as torch.save writes them); copy it again"
    expected = {
        "garbage": f"{shard}: sha256 ",  # ... differs from the checksums.json record
        "garbage, no checksums.json": f"{shard}: not readable as a checkpoint shard {unreadable}",
        "cut, no checksums.json": "shard file __0_0.distcp is truncated",
        "model.pt garbage, no checksums.json": f"{shard}: not readable as a model state {unreadable}",
    }
    assert expected[damage] in line
    assert sorted(p.name for p in folder.iterdir()) == [kind]


def test_unshard_names_a_damaged_shard_in_one_line(runs: dict[str, Path], tmp_path: Path) -> None:
    """The commands that read a checkpoint outside training go through the same reader."""
    shutil.copytree(runs["run"] / "step2", tmp_path / "step2")
    shard = tmp_path / "step2" / "__0_0.distcp"
    shard.write_bytes(np.random.default_rng(1).integers(0, 256, shard.stat().st_size, dtype=np.uint8).tobytes())
    (tmp_path / "step2" / "checksums.json").unlink()
    cmd = [sys.executable, "-m", "olmo_cli.train_main", "unshard", str(tmp_path / "step2")]
    proc = subprocess.run([*cmd, "--destination", str(tmp_path / "out")], cwd=REPO, text=True, capture_output=True)
    one_line_error(proc, f"{shard}: not readable as a checkpoint shard")
    assert not (tmp_path / "out").exists()


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                out.append(int(entry.name))
    return out


def running(pid: int) -> bool:
    """Whether `pid` is a live process (a zombie, dead but not yet reaped by whoever adopted it, is not)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("killed", ["olmo-train", "torchrun"])
def test_a_killed_launcher_takes_its_ranks_with_it(runs: dict[str, Path], tmp_path: Path, killed: str) -> None:
    """torchrun starts each rank in a session of its own, so `kill -9` of the launcher (an out-of-memory killer,
    a scheduler) left both ranks training to the end, unseen. Now torchrun dies with `olmo-train train`, and the
    ranks with torchrun: each stops within seconds (saving a checkpoint first, as when preempted)."""
    folder = tmp_path / "run"
    cmd = [sys.executable, "-m", "olmo_cli.train_main", "train", str(runs["config"]), "--nproc", "2"]
    cmd += [f"--save_folder={folder}", "--max_duration=100000", "--distributed_strategy=ddp", "--save_interval=5000"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "log.txt"
    with open(log, "w") as out:
        launcher = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    ranks: list[int] = []
    try:
        deadline = time.time() + 120
        while "step 3/" not in log.read_text():  # both ranks are training
            assert launcher.poll() is None, log.read_text()
            assert time.time() < deadline, log.read_text()
            time.sleep(0.2)
        [torchrun] = children(launcher.pid)
        ranks = children(torchrun)
        assert len(ranks) == 2
        os.kill(launcher.pid if killed == "olmo-train" else torchrun, signal.SIGKILL)
        t0 = time.time()
        while any(running(p) for p in [torchrun, *ranks]) and time.time() - t0 < 30:
            time.sleep(0.1)
        took = time.time() - t0
        assert not any(running(p) for p in [torchrun, *ranks]), f"still running after {took:.0f}s: {log.read_text()}"
        assert took < 10, f"the ranks took {took:.1f}s to stop"
        assert "stop signal received: saving a checkpoint" in log.read_text()
    finally:
        for pid in [launcher.pid, *ranks]:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        launcher.wait()
