"""Inputs an unlucky user or a hostile file gives the newer commands: a side file of the wrong shape, a number too
large for a float or an int, a device this machine lacks, a disk that fills up. Each is one line naming the file,
key or flag, exit 2, no traceback, nothing partial left."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from olmo_cli.main import main
from olmo_data.suffix_index.layout import index_folder
from tests.cli.test_full_disk import leftovers
from tests.data.suffix_index.test_suffix_index import make_files
from tests.helpers import small_disk


def one_line(result: Result, *fragments: str) -> str:
    """The result is exit 2 with one line of output (click's runner mixes stderr in), holding each fragment."""
    out = result.output
    assert result.exit_code == 2 and "Traceback" not in out, out
    assert out.count("\n") == 1, out
    for fragment in fragments:
        assert fragment in out, out
    return out


def index_config(tmp_path: Path) -> tuple[list[str], Path]:
    paths, cfg = make_files(tmp_path, "uint16")
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return paths, tmp_path / "config.yaml"


@pytest.mark.parametrize(
    ("manifest", "says"),
    [([1, 2], "not a JSON object"), ({"shards": "many"}, "shards"), ({"shards": [1, "x"]}, "shards")],
)
def test_an_index_manifest_of_the_wrong_shape_is_one_line(tmp_path: Path, manifest: object, says: str) -> None:
    paths, config = index_config(tmp_path)
    out = tmp_path / "index"
    args = ["index", str(config), "--index-dir", str(out), "--shard-tokens", "1000"]
    assert CliRunner().invoke(main, args).exit_code == 0
    folder = index_folder(paths[0], str(out))
    (folder / "manifest.json").write_text(json.dumps(manifest))
    trace = ["trace", str(config), "--tokens", "0,7,14", "--index-dir", str(out)]
    one_line(CliRunner().invoke(main, trace), str(folder / "manifest.json"), says)
    rebuilt = CliRunner().invoke(main, args)  # the rerun rebuilds what it cannot read
    assert rebuilt.exit_code == 0, rebuilt.output


def test_a_damaged_shard_record_is_rebuilt_on_rerun(tmp_path: Path) -> None:
    paths, config = index_config(tmp_path)
    out = tmp_path / "index"
    args = ["index", str(config), "--index-dir", str(out), "--shard-tokens", "1000"]
    assert CliRunner().invoke(main, args).exit_code == 0
    folder = index_folder(paths[0], str(out))
    (folder / "manifest.json").unlink()
    for damaged in ("{not json", "[]", '{"start": "x"}'):
        (folder / "shard-00001.json").write_text(damaged)
        again = CliRunner().invoke(main, args)
        assert again.exit_code == 0 and "Traceback" not in again.output, again.output
        assert "sorted 1 " in again.output, again.output
        (folder / "manifest.json").unlink()


def test_index_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, config = index_config(tmp_path)
    with small_disk(tmp_path / "disk", "12k") as real:
        out = tmp_path / "disk" / "index"
        if not real:  # the shards are written by numpy (tofile), past builtins.open: their records are refused

            def refuse(*a: object) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr("olmo_data.suffix_index.index.write_json_atomic", refuse)
        args = ["index", str(config), "--index-dir", str(out), "--shard-tokens", "1000"]
        one_line(CliRunner().invoke(main, args), "the disk is full", str(out))
        assert leftovers(tmp_path / "disk") == []


@pytest.mark.parametrize("device", ["gpu", "cuda", "cuda:7", "tpu"])
@pytest.mark.parametrize("command", ["eval", "generate"])
def test_a_device_this_machine_lacks_is_one_line(tmp_path: Path, device: str, command: str) -> None:
    import torch

    from olmo_cli.train_main import main as olmo_train

    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has the GPU asked for")
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    extra = ["--tasks", "piqa"] if command == "eval" else ["--prompt", "x"]
    result = CliRunner().invoke(olmo_train, [command, str(tmp_path), *extra, "--device", device])
    said = "not a device" if device in ("gpu", "tpu") else "CUDA GPU"
    one_line(result, f"--device {device}: ", said)


def test_unshard_on_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every conversion writes through one temporary directory (soup's test is in tests/checkpoint/test_soup.py)."""
    import errno
    import os
    import warnings

    from olmo_cli.train_main import main as olmo_train
    from tests.convert.test_unshard import save_both

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sharded, _ = save_both(tmp_path / "run", tied=False)
    with small_disk(tmp_path / "disk", "16k") as real:
        if not real:
            import torch

            def refuse(*a: object, **k: object) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            monkeypatch.setattr(torch, "save", refuse)
        dest = tmp_path / "disk" / "unsharded"
        result = CliRunner().invoke(olmo_train, ["unshard", str(sharded), "--destination", str(dest)])
        one_line(result, f"error: {dest}: the disk is full (No space left on device); the partial .tmp-unsharded was")
        assert list((tmp_path / "disk").iterdir()) == []
