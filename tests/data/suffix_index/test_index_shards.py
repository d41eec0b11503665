"""`olmo-data index --shard I/N`: machines in any order give the one-machine index byte for byte; a query before
every machine is done names the shards missing and the `--shard` that builds them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.instances import open_from_config
from olmo_data.errors import DataError
from olmo_data.suffix_index import build_index, open_index
from tests.data.suffix_index.test_suffix_index import make_files
from tests.slurm_cluster import REPO, SlurmCluster, local_slurm


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_three_machines_in_any_order_give_the_one_machine_index(tmp_path: Path) -> None:
    _, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    build_index(source, index_dir=str(whole), shard_tokens=700, context=9, progress=False)
    expected = tree(whole)
    assert len([n for n in expected if n.endswith(".u32")]) == 10  # 5 shards a file, dealt 4/3/3

    done = []
    for i in (0, 2, 1):
        summary = build_index(source, index_dir=str(parts), shard_tokens=700, context=9, progress=False, part=(i, 3))
        done.append(summary.built)
        if i != 1:  # machine 1 is still to run: no manifest, and a query says which shards to build
            assert summary.pending > 0
            assert not any(n.endswith("manifest.json") for n in tree(parts))
            with pytest.raises(DataError, match=r"unfinished: [23] of its 5 shards are missing or stale .*--shard 1/3"):
                open_index(source, str(parts))
    assert done == [4, 3, 3] and summary.pending == 0
    assert tree(parts) == expected  # every file, byte for byte (no plan left behind)
    index = open_index(source, str(parts))
    assert index is not None and index.count([0, 7]) > 0

    # a rerun of one machine over the finished index sorts nothing and changes nothing
    assert (
        build_index(source, index_dir=str(parts), shard_tokens=700, context=9, progress=False, part=(2, 3)).built == 0
    )
    assert tree(parts) == expected


def test_the_command_takes_a_slurm_array_task_and_names_the_missing_shard(tmp_path: Path) -> None:
    _, cfg = make_files(tmp_path, "uint16", n=1500)
    cfg.update(seed=1, global_train_batch_size=4, max_duration="1ep")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runner = CliRunner()
    args = ["index", str(config), "--shard-tokens", "500", "--no-progress"]
    slurm = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4", "SLURM_ARRAY_TASK_COUNT": "2"}
    result = runner.invoke(main, args, env=slurm)
    assert result.exit_code == 0, result.output
    assert "shard 1/2 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)" in result.output
    assert "still to do" in result.output

    result = runner.invoke(main, ["trace", str(config), "--tokens", "0,7"])
    assert result.exit_code == 2
    assert "unfinished: 2 of its 3 shards are missing or stale (shard-00000, shard-00002)" in result.output
    assert "--shard 0/2`" in result.output

    result = runner.invoke(main, [*args, "--shard", "0/2"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["trace", str(config), "--tokens", "0,7"])
    assert result.exit_code == 0 and "looked up in the suffix index of 3,000 tokens" in result.output

    result = runner.invoke(main, [*args, "--shard", "2/2"])
    assert result.exit_code == 2 and "I must be below N" in result.output


def test_a_changed_file_is_not_vouched_for_by_another_machines_stale_shards(tmp_path: Path) -> None:
    paths, cfg = make_files(tmp_path, "uint16", n=1400)
    source = open_from_config(cfg)
    for i in (0, 1):
        build_index(source, shard_tokens=700, context=9, progress=False, part=(i, 2))
    data = np.fromfile(paths[1], dtype=np.uint16)
    data[-5:] = 3  # shard 1 of the second file (machine 1's) changes
    data.tofile(paths[1])
    source = open_from_config(cfg)
    summary = build_index(source, shard_tokens=700, context=9, progress=False, part=(0, 2))
    assert summary.built == 0 and summary.pending == 1  # machine 0's shards still hold; machine 1's does not
    with pytest.raises(
        DataError, match=r"unfinished: 1 of its 2 shards are missing or stale \(shard-00001\).*--shard 1/2`"
    ):
        open_index(source)
    build_index(source, shard_tokens=700, context=9, progress=False, part=(1, 2))
    index = open_index(source)
    assert index is not None and index.count([3, 3, 3, 3, 3]) == 1


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    with local_slurm(tmp_path_factory.mktemp("slurm")) as cluster:
        yield cluster


@pytest.mark.slow
def test_slurm_index_as_a_3_task_array_job(slurm: SlurmCluster, tmp_path: Path) -> None:
    """sbatch --array=0-2 scripts/slurm_index.sh: each task sorts its share, the last writes the manifests, and
    the index is the one-machine build's, byte for byte."""
    _, cfg = make_files(tmp_path, "uint16")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg))
    settings = ["--shard-tokens", "700", "--context", "9", "--engine", "numpy"]
    job = slurm.sbatch(
        "--array=0-2",
        "--cpus-per-task=1",
        f"--output={tmp_path}/index-%A_%a.out",
        str(REPO / "scripts" / "slurm_index.sh"),
        *[str(config), "--index-dir", str(tmp_path / "parts"), *settings],
    )
    for task in range(3):
        done = slurm.wait(f"{job}_{task}", "COMPLETED")
        log = (tmp_path / f"index-{job}_{task}.out").read_text()
        assert f"shard {task}/3 (from SLURM_ARRAY_TASK_ID/SLURM_ARRAY_TASK_COUNT)" in log, slurm.describe(done)
    source = open_from_config(cfg)
    build_index(source, index_dir=str(tmp_path / "whole"), shard_tokens=700, context=9, engine="numpy")
    assert tree(tmp_path / "parts") == tree(tmp_path / "whole")


def test_a_rebuild_with_larger_shards_leaves_no_old_shard_files(tmp_path: Path) -> None:
    _, cfg = make_files(tmp_path, "uint16")
    source = open_from_config(cfg)
    build_index(source, index_dir=str(tmp_path / "a"), shard_tokens=700, context=9, progress=False)
    summary = build_index(source, index_dir=str(tmp_path / "a"), shard_tokens=3000, context=9, progress=False)
    fresh = build_index(source, index_dir=str(tmp_path / "b"), shard_tokens=3000, context=9, progress=False)
    assert tree(tmp_path / "a") == tree(tmp_path / "b")  # shard-00001 ... of the 700-token build are gone
    assert summary.index_bytes == fresh.index_bytes


def test_a_machine_removes_only_its_own_shards_leftovers(tmp_path: Path) -> None:
    """Another machine of a --shard build may be writing its shard in the same folder right now: its `.tmp-` file
    is not this machine's to remove (a 3-task Slurm array job once lost a shard so), while this machine's own
    leftovers of a killed build go."""
    from olmo_data.suffix_index.layout import index_folder

    paths, cfg = make_files(tmp_path, "uint16", n=1400)  # two shards a file: the first file's are machine 0's, 1's
    folder = index_folder(paths[0])
    folder.mkdir(parents=True)
    theirs = folder / ".tmp-shard-00001.u32.live"
    mine = [folder / ".tmp-shard-00000.u32.dead", folder / ".tmp-shard-00000.json.dead"]
    for p in (theirs, *mine):
        p.write_bytes(b"half")
    build_index(open_from_config(cfg), shard_tokens=700, context=9, progress=False, part=(0, 2))
    assert theirs.exists() and not any(p.exists() for p in mine)
