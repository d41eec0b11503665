"""Checkpoint files survive being killed at the worst moment: re-saving a step that exists, and downloading a
remote checkpoint."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from olmo_data.remote import RemoteReader
from olmo_train import checkpoint as ckpt
from olmo_train.checkpoint import fetch, save
from olmo_train.distributed import Dist

SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))


class Killed(BaseException):
    """Stands for SIGKILL: nothing after the point it is raised at runs."""


def write_step(folder: Path, step: int, marker: str) -> Path:
    tmp = save.begin_save(folder, f"step{step}", SINGLE)
    (tmp / "weights").write_text(marker)
    return save.finish_save(folder, f"step{step}", tmp, ckpt.TrainerState(step=step), "latest", -1, SINGLE)


def test_killed_while_replacing_a_step_keeps_a_complete_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_step(tmp_path, 2, "old")
    real_replace = os.replace

    def killed_before_the_new_copy_lands(src: str | Path, dst: str | Path) -> None:
        if Path(src).name == ".tmp-step2" and Path(dst).name == "step2":
            raise Killed
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_before_the_new_copy_lands)
    with pytest.raises(Killed):
        write_step(tmp_path, 2, "new")
    monkeypatch.setattr(os, "replace", real_replace)
    ckpt.remove_stale_temporaries(tmp_path)  # what the next start does
    latest = ckpt.latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "step2", "the only complete copy of step 2 was deleted"
    assert (latest / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step2"]


def test_replacing_a_step_leaves_only_the_new_copy(tmp_path: Path) -> None:
    write_step(tmp_path, 2, "old")
    write_step(tmp_path, 2, "new")
    assert (tmp_path / "step2" / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step2"]
    # killed after the new copy landed but before the old one was removed: the next start drops the old one
    shutil.copytree(tmp_path / "step2", tmp_path / ".replaced-step2")
    (tmp_path / ".replaced-step2" / "weights").write_text("old")
    ckpt.remove_stale_temporaries(tmp_path)
    assert (tmp_path / "step2" / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step2"]


def test_interrupted_download_is_not_reused(
    tmp_path: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    root, url = http_root
    remote = root / "step3-unsharded"
    remote.mkdir()
    (remote / "trainer_state.json").write_text(json.dumps({"step": 3}))
    (remote / "model.pt").write_bytes(b"m" * 10_000)
    (remote / "optim.pt").write_bytes(b"o" * 10_000)
    real_download = RemoteReader.download

    def interrupted_download(self: RemoteReader, source: str, write: Callable[[bytes], Any], **_: Any) -> None:
        data = self.read_all(source)
        write(data[: len(data) // 2])
        raise Killed

    monkeypatch.setattr(RemoteReader, "download", interrupted_download)
    with pytest.raises(Killed):
        fetch.download(f"{url}/step3-unsharded")
    monkeypatch.setattr(RemoteReader, "download", real_download)
    local = fetch.download(f"{url}/step3-unsharded")
    for name in ("trainer_state.json", "model.pt", "optim.pt"):
        assert (local / name).read_bytes() == (remote / name).read_bytes(), f"{name}: a partial download was reused"
    assert sorted(p.name for p in local.iterdir()) == ["model.pt", "optim.pt", "trainer_state.json"]


def test_a_keep_count_of_zero_never_removes_the_checkpoint_just_saved(tmp_path: Path) -> None:
    """A config refuses keep=0; called with it anyway, pruning keeps the newest (it deleted every checkpoint,
    `latest` pointing at nothing)."""
    for step in (2, 3):
        tmp = save.begin_save(tmp_path, f"step{step}", SINGLE)
        save.finish_save(tmp_path, f"step{step}", tmp, ckpt.TrainerState(step=step), "latest", 0, SINGLE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step3"]
    assert ckpt.latest_checkpoint(tmp_path) == tmp_path / "step3"
