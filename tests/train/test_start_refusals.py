"""Runs refused at start: a schedule that cannot fit a run whose length is given in tokens or epochs (known only
once the data is open), a length too large for a number, a parent that is not there. One line naming the key,
exit 2, and no save folder left behind that the refused run created."""

from __future__ import annotations

from pathlib import Path

import pytest

from olmo_train.train import main
from tests.checkpoint.test_disk_full import SEQ, config, only_error_line, tokens  # noqa: F401 (a fixture)


@pytest.mark.parametrize(
    ("duration", "says"),
    [
        (f"{6 * 4 * SEQ}T", "6 steps"),  # 6 steps of 4 x SEQ tokens
        ("1ep", "7 steps"),  # 30 x SEQ tokens make 30 instances, 7 steps of 4
    ],
)
def test_wsd_longer_than_a_run_in_tokens_or_epochs_is_refused(
    tokens: str,  # noqa: F811
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    duration: str,
    says: str,
) -> None:
    scheduler = {"name": "wsd", "t_warmup": 5, "t_decay": 3}
    cfg = config(tmp_path, tokens, max_duration=duration, scheduler=scheduler)
    capfd.readouterr()
    assert main([cfg]) == 2
    line = only_error_line(capfd.readouterr().err)
    assert "config key 'scheduler.t_warmup': the warm-up (5) and the decay (3) are longer than the schedule" in line
    assert says in line and duration in line, line
    assert not (tmp_path / "run").exists(), "the refused run left its save folder"
    fits = config(tmp_path, tokens, max_duration=duration, scheduler={**scheduler, "t_warmup": 2}, stop_at=1)
    assert main([fits]) == 0


def test_a_duration_too_large_for_a_number_is_one_line(
    tokens: str,  # noqa: F811
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    capfd.readouterr()
    assert main([config(tmp_path, tokens), "--max_duration=1e400T"]) == 2
    line = only_error_line(capfd.readouterr().err)
    assert "config key 'max_duration': got '1e400T'" in line, line
    assert not (tmp_path / "run").exists()


def test_a_missing_parent_leaves_no_save_folder(
    tokens: str,  # noqa: F811
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    capfd.readouterr()
    assert main([config(tmp_path, tokens, load_path=str(tmp_path / "nowhere"))]) == 2
    line = only_error_line(capfd.readouterr().err)
    assert "nowhere" in line, line
    assert not (tmp_path / "run").exists(), "the refused run left its save folder"
