"""The olmo-data commands on a disk that fills up while they write: one line that says so and names the folder, no
temporaries left, and the same command completes once there is space. On a real (tmpfs) disk when the tests run
as root, as in CI; otherwise on a write that raises the ENOSPC a full disk raises."""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from olmo_cli.main import main
from tests.helpers import small_disk

ROW = {
    "messages": [{"role": "user", "content": "What is this thing here?"}, {"role": "assistant", "content": "A test."}]
}


def fill_on_write(monkeypatch: pytest.MonkeyPatch, room: int) -> None:
    """Without a small disk: every file written through the data library's atomic writer takes `room` bytes in all,
    then raises ENOSPC."""
    import builtins

    left = [room]
    opened = builtins.open

    class Filling:
        def __init__(self, f: Any) -> None:
            self._f = f

        def write(self, data: Any) -> int:
            n = len(data.encode() if isinstance(data, str) else memoryview(data).cast("B"))
            left[0] -= n
            if left[0] < 0:
                raise OSError(errno.ENOSPC, "No space left on device")
            return int(self._f.write(data))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> Filling:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    def filling_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = opened(file, mode, *args, **kwargs)
        return Filling(f) if "w" in mode and ".tmp-" in str(file) else f

    monkeypatch.setattr(builtins, "open", filling_open)


def leftovers(dest: Path) -> list[str]:
    return sorted(p.name for p in dest.rglob("*") if p.name.startswith(".tmp")) if dest.exists() else []


def test_prepare_tulu_on_a_full_disk(demo_tokenizer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps({**ROW, "id": str(i)}) + "\n" for i in range(3000)))
    args = ["-d", str(src), "-t", demo_tokenizer, "--sequence-length", "64"]
    with small_disk(tmp_path / "disk", "200k") as real:
        dest = tmp_path / "disk" / "sft"
        if not real:
            fill_on_write(monkeypatch, 200_000)
        result = CliRunner().invoke(main, ["prepare-tulu", *args, "--destination", str(dest)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.output.count("\n") == 1, result.output
        assert f"error: {dest}: the disk is full" in result.output and "free space there and rerun" in result.output
        assert leftovers(tmp_path / "disk") == [] and not dest.exists()
    monkeypatch.undo()
    dest = tmp_path / "sft"  # with space: the same command completes
    result = CliRunner().invoke(main, ["prepare-tulu", *args, "--destination", str(dest)])
    assert result.exit_code == 0, result.output
    assert (dest / "manifest.json").is_file() and leftovers(dest) == []


def test_tokenize_on_a_full_disk(demo_corpus: list[str], demo_tokenizer: str, tmp_path: Path) -> None:
    """(The injected variant, with several processes, is in tests/data/test_tokenize.py.)"""
    args = ["-d", *demo_corpus[:2], "-t", demo_tokenizer, "--backend", "hf"]
    with small_disk(tmp_path / "disk", "100k") as real:
        if not real:
            pytest.skip("needs root to mount a small tmpfs; the injected ENOSPC variant runs in test_tokenize.py")
        dest = tmp_path / "disk" / "tokens"
        result = CliRunner().invoke(main, ["tokenize", *args, "--destination", str(dest)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert f"error: {dest}: the disk is full" in result.output, result.output
        assert leftovers(tmp_path / "disk") == []
        shutil.rmtree(dest, ignore_errors=True)
    dest = tmp_path / "tokens"
    result = CliRunner().invoke(main, ["tokenize", *args, "--destination", str(dest)])
    assert result.exit_code == 0, result.output
