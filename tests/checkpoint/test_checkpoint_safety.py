"""Loading a checkpoint never runs its code and never loads a corrupt byte.

Each crafted checkpoint below is loaded every way the project loads one (a resume through `load_checkpoint`,
`unshard`, `export-hf`, `verify`, and a download by URL over a loopback HTTP server): each must fail with one line
naming the file, run nothing (the marker file a crafted pickle would create never appears) and write nothing
outside the checkpoint or the download cache entry. A crafted checkpoint gets a matching checksums.json (whoever
crafts one writes that too), so that the safety checks, not the checksums, are what stop it.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.config import load_config
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.checkpoint import safety
from olmo_train.checkpoint.integrity import hash_file, record_of
from olmo_train.convert import export_hf, unshard
from olmo_train.distributed import Dist
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer
from tests.convert.test_unshard import save_both
from tests.train.test_train_e2e import REPO, launch, tiny_config, write_tokens

SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
SHARD = "__0_0.distcp"


class RunsCommand:
    """Pickles to "call os.system('touch MARKER')": what a `.metadata` crafted to run code holds."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {self.marker}",)


SYSTEM = f"{os.system.__module__}.system"  # how the pickle names it: posix.system


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """step1/ (sharded) and step1-unsharded/ of a tiny model after one AdamW step, saved by the trainer's code."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return save_both(tmp_path_factory.mktemp("saved") / "run", tied=False)


@pytest.fixture
def sharded(saved: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of step1/ to damage."""
    copy = tmp_path / "run" / "step1"
    shutil.copytree(saved[0], copy)
    return copy


def fresh(checkpoint: Path) -> tuple[Transformer, torch.optim.Optimizer]:
    cfg = load_config(checkpoint / ckpt.CONFIG, require_data=False)
    model = Transformer(cfg.model)
    return model, build_optimizer(model, cfg.optimizer)


def resume(
    checkpoint: Path, model_and_optim: tuple[Transformer, torch.optim.Optimizer] | None = None
) -> ckpt.TrainerState:
    model, optim = model_and_optim or fresh(checkpoint)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ckpt.load_checkpoint(checkpoint, model, optim, SINGLE)


def forge(checkpoint: Path, name: str, data: bytes) -> None:
    """Replace a file and its checksums.json record alike."""
    (checkpoint / name).write_bytes(data)
    checksums = json.loads((checkpoint / "checksums.json").read_text())
    checksums["files"][name] = record_of(data)
    (checkpoint / "checksums.json").write_text(json.dumps(checksums))


def verify_cli(target: str, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(olmo_train_cli, ["verify", target, *args])
    return result.exit_code, result.stdout


def serve(checkpoint: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """The checkpoint on the loopback server: (its URL, the folder of checkpoint downloads)."""
    root, url = http_root
    shutil.copytree(checkpoint, root / checkpoint.name)
    monkeypatch.setenv("OLMO_DATA_CACHE", str(root.parent / "cache"))
    return f"{url}/{checkpoint.name}", root.parent / "cache" / "checkpoints"


def refused_everywhere(checkpoint: Path, tmp_path: Path, match: str) -> None:
    """The same one-line refusal from a resume, unshard, export and verify; nothing written."""
    for attempt in (
        lambda: resume(checkpoint),
        lambda: unshard(checkpoint, tmp_path / "unsharded"),
        lambda: export_hf(checkpoint, tmp_path / "hf"),
    ):
        with pytest.raises(DataError, match=re.escape(match)) as e:
            attempt()
        assert "\n" not in str(e.value)
    code, out = verify_cli(str(checkpoint))
    assert code == 2 and out.startswith("FAILED ") and match in out and out.count("\n") == 1, out
    assert not (tmp_path / "unsharded").exists() and not (tmp_path / "hf").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


# ---- no code runs ---------------------------------------------------------------------------------------------


def test_metadata_that_runs_a_command_is_refused_and_runs_nothing(
    sharded: Path, tmp_path: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "MARKER"
    pickle.loads(pickle.dumps(RunsCommand(tmp_path / "PROOF")))  # the payload works when unpickled freely
    assert (tmp_path / "PROOF").exists()
    forge(sharded, ".metadata", pickle.dumps(RunsCommand(marker)))
    match = f"{sharded / '.metadata'}: refers to {SYSTEM}, which checkpoint metadata is not made of; refused"
    refused_everywhere(sharded, tmp_path, match)
    url, cache = serve(sharded, http_root, monkeypatch)
    with pytest.raises(DataError, match=rf"/\.metadata: refers to {re.escape(SYSTEM)}, which checkpoint metadata"):
        ckpt.localize(url, SINGLE)
    code, out = verify_cli(url)
    assert code == 2 and f"refers to {SYSTEM}" in out
    assert not marker.exists(), "the checkpoint ran its code"


def test_non_tensor_entry_that_runs_a_command_is_refused(tmp_path: Path) -> None:
    """Entries that are not tensors (an optimizer's hyperparameters) are pickles inside the shards: DCP's own
    planners load them with weights_only=False."""
    marker = tmp_path / "MARKER"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"lr": RunsCommand(marker), "w": torch.ones(3)}, checkpoint_id=str(tmp_path / "c"))
        with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'c'}: checkpoint entry lr is not plain data")):
            safety.load_sharded(tmp_path / "c", {"lr": 0.1, "w": torch.zeros(3)})
        with pytest.raises(DataError, match="checkpoint entry lr is not plain data"):
            safety.read_keys(tmp_path / "c", {"lr"})
        assert torch.equal(safety.read_keys(tmp_path / "c", {"w"})["w"], torch.ones(3))
    assert not marker.exists()


def test_rng_file_that_runs_a_command_leaves_the_seeded_rng(
    sharded: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "MARKER"
    buffer = io.BytesIO()
    torch.save({"python": RunsCommand(marker)}, buffer)
    forge(sharded, "rng/rank0.pt", buffer.getvalue())
    model_and_optim = fresh(sharded)
    torch.manual_seed(5)
    seeded = torch.get_rng_state()
    resume(sharded, model_and_optim)
    assert torch.equal(torch.get_rng_state(), seeded) and not marker.exists()
    assert "rng/rank0.pt: not loadable as plain data (UnpicklingError); keeping the seeded RNG state" in caplog.text
    code, out = verify_cli(str(sharded))
    assert code == 2 and f"rng/rank0.pt: refers to {SYSTEM}" in out


# ---- names stay inside --------------------------------------------------------------------------------------


def test_shard_name_outside_the_checkpoint_is_refused(
    sharded: Path, tmp_path: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    metadata = safety.read_metadata(sharded / ".metadata")
    for info in metadata.storage_data.values():
        info.relative_path = "../x.distcp"
    shutil.copy(sharded / SHARD, sharded.parent / "x.distcp")  # where a trusting reader would find it
    forge(sharded, ".metadata", pickle.dumps(metadata))
    refused_everywhere(sharded, tmp_path, f"{sharded / '.metadata'}: shard name '../x.distcp' is not a file name")

    url, cache = serve(sharded, http_root, monkeypatch)
    shutil.copy(sharded / SHARD, http_root[0] / "x.distcp")  # a download that followed the name would succeed
    before = set(http_root[0].parent.rglob("*"))
    with pytest.raises(DataError, match=r"/\.metadata: shard name '\.\./x\.distcp' is not a file name inside"):
        ckpt.localize(url, SINGLE)
    written = {p for p in set(http_root[0].parent.rglob("*")) - before if p.is_file()}
    entry = next(cache.glob("checkpoint-*"))
    assert all(p.parent in (cache, entry) and not p.name.endswith("x.distcp") for p in written), written


def test_listed_file_name_outside_the_cache_entry_is_refused_before_it_is_fetched(
    saved: tuple[Path, Path], tmp_path: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = tmp_path / "step1-unsharded"
    shutil.copytree(saved[1], checkpoint)
    checksums = json.loads((checkpoint / "checksums.json").read_text())
    checksums["files"]["../../escaped.pt"] = record_of(b"x")
    (checkpoint / "checksums.json").write_text(json.dumps(checksums))
    url, cache = serve(checkpoint, http_root, monkeypatch)
    with pytest.raises(DataError, match=r"checksums.json: file name '\.\./\.\./escaped\.pt' is not a relative path"):
        ckpt.localize(url, SINGLE)
    assert not list(tmp_path.rglob("escaped.pt"))
    with pytest.raises(DataError, match=r"checksums.json: file name '\.\./\.\./escaped\.pt' is not a relative path"):
        resume(checkpoint)


def test_link_out_of_its_folder_is_refused(sharded: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(sharded, elsewhere / "step1")
    run = sharded.parent
    (run / "latest").symlink_to("step1")
    assert ckpt.localize(str(run / "latest"), SINGLE) == run / "latest"  # the trainer's own link: followed
    (run / "other").symlink_to(elsewhere / "step1")
    match = f"{run / 'other'}: a link to {elsewhere / 'step1'}, outside {run}; give that directory itself"
    with pytest.raises(DataError, match=re.escape(match)):
        ckpt.localize(str(run / "other"), SINGLE)
    with pytest.raises(DataError, match=re.escape(match)):
        unshard(run / "other", tmp_path / "out")
    assert verify_cli(str(run / "other"))[0] == 2
    (sharded / SHARD).unlink()  # a shard that is a link out of the checkpoint is a name that leaves it
    (sharded / SHARD).symlink_to(elsewhere / "step1" / SHARD)
    with pytest.raises(
        DataError, match=re.escape(f"checksums.json: file name '{SHARD}' is not a relative path inside")
    ):
        resume(sharded)
    (sharded / "checksums.json").unlink()
    with pytest.raises(
        DataError, match=re.escape(f".metadata: shard name '{SHARD}' is not a file name inside {sharded}")
    ):
        resume(sharded)


# ---- no corrupt byte is loaded -----------------------------------------------------------------------------


def flip_a_weight_byte(checkpoint: Path) -> Path:
    """Flip a byte in the middle of the embedding's stored data; returns the shard."""
    metadata = safety.read_metadata(checkpoint / ".metadata")
    info = next(v for k, v in metadata.storage_data.items() if k.fqn == "model.embeddings.weight")
    shard = checkpoint / info.relative_path
    data = bytearray(shard.read_bytes())
    data[info.offset + info.length // 2] ^= 0x10
    shard.write_bytes(bytes(data))
    return shard


def test_flipped_byte_in_tensor_data_is_refused_naming_the_shard(
    sharded: Path,
    saved: tuple[Path, Path],
    tmp_path: Path,
    http_root: tuple[Path, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shard = flip_a_weight_byte(sharded)
    refused_everywhere(sharded, tmp_path, f"{shard}: sha256 {hash_file(shard)['sha256']} differs from the checksums")
    url, cache = serve(sharded, http_root, monkeypatch)
    with pytest.raises(DataError, match=re.escape(f"{url}/{SHARD}: sha256 {hash_file(shard)['sha256']} differs")):
        ckpt.localize(url, SINGLE)
    entry = next(cache.glob("checkpoint-*"))
    assert not (entry / SHARD).exists(), "a corrupt download got the shard's name"
    assert not list(entry.glob(f".{SHARD}.part-*"))
    # what the checksums prevent: without them the flipped byte loads silently as another weight
    (sharded / "checksums.json").unlink()
    model, optim = fresh(sharded)
    resume(sharded, (model, optim))
    reference = torch.load(saved[1] / "model.pt", weights_only=True)["embeddings.weight"]
    assert (model.embeddings.weight.detach() != reference).sum() == 1


def test_truncated_shard_is_refused(sharded: Path, tmp_path: Path) -> None:
    size = (sharded / SHARD).stat().st_size
    with (sharded / SHARD).open("r+b") as f:
        f.truncate(size // 2)
    refused_everywhere(sharded, tmp_path, f"{sharded / SHARD}: truncated ({size // 2} bytes, checksums.json records")


def test_tensor_declared_larger_than_its_storage_is_refused(sharded: Path, tmp_path: Path) -> None:
    """Metadata declaring a 4 TB tensor stored in a few bytes: a load would allocate the 4 TB first."""
    import dataclasses

    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    metadata = safety.read_metadata(sharded / ".metadata")
    fqn = "model.embeddings.weight"
    entry = metadata.state_dict_metadata[fqn]
    huge = torch.Size([2**20, 2**20])
    chunk = ChunkStorageMetadata(offsets=entry.chunks[0].offsets, sizes=huge)
    metadata.state_dict_metadata[fqn] = dataclasses.replace(entry, size=huge, chunks=[chunk])
    forge(sharded, ".metadata", pickle.dumps(metadata))
    refused_everywhere(
        sharded, tmp_path, f"{sharded / '.metadata'}: tensor {fqn} declares a piece of [1048576, 1048576] torch.float32"
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("step", "5", "step must be an integer of 0 or more, got '5'"),
        ("tokens_seen", -1, "tokens_seen must be an integer of 0 or more, got -1"),
        ("world_size", 0, "world_size must be an integer of 1 or more, got 0"),
        ("seed", True, "seed must be an integer of 0 or more, got True"),
        ("data_fingerprint", 7, "data_fingerprint must be a string, got 7"),
    ],
)
def test_trainer_state_of_the_wrong_type_is_refused_by_field(
    sharded: Path, tmp_path: Path, field: str, value: Any, message: str
) -> None:
    state = json.loads((sharded / "trainer_state.json").read_text())
    forge(sharded, "trainer_state.json", json.dumps({**state, field: value}).encode())
    refused_everywhere(sharded, tmp_path, f"{sharded / 'trainer_state.json'}: {message}")


def test_damaged_trainer_state_is_named_by_its_checksum_before_it_is_parsed(sharded: Path, tmp_path: Path) -> None:
    path = sharded / "trainer_state.json"
    data = path.read_bytes()
    path.write_bytes(data.replace(b"{", b"[", 1))  # same length, no longer JSON
    refused_everywhere(sharded, tmp_path, f"{path}: sha256 ")


def test_corrupt_unsharded_file_is_refused(saved: tuple[Path, Path], tmp_path: Path) -> None:
    checkpoint = tmp_path / "step1-unsharded"
    shutil.copytree(saved[1], checkpoint)
    data = bytearray((checkpoint / "model.pt").read_bytes())
    data[len(data) // 2] ^= 1
    (checkpoint / "model.pt").write_bytes(bytes(data))
    with pytest.raises(DataError, match=re.escape(f"{checkpoint / 'model.pt'}: sha256 ")):
        resume(checkpoint)
    code, out = verify_cli(str(checkpoint))
    assert code == 2 and f"FAILED {checkpoint / 'model.pt'}: sha256 " in out


# ---- what still works ------------------------------------------------------------------------------------------


def test_every_file_is_recorded_and_verify_passes(saved: tuple[Path, Path]) -> None:
    for checkpoint in saved:
        listed = json.loads((checkpoint / "checksums.json").read_text())
        assert listed["version"] == 1
        on_disk = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
        assert set(listed["files"]) == on_disk - {"checksums.json"}
        for name, record in listed["files"].items():
            assert hash_file(checkpoint / name) == record, name
        code, out = verify_cli(str(checkpoint), "--strict")
        assert code == 0 and out.startswith(f"OK {checkpoint}: ") and "5 files (" in out, out
    assert "metadata safe, " in verify_cli(str(saved[0]))[1]


def test_round_trip_restores_weights_optimizer_and_rng(saved: tuple[Path, Path]) -> None:
    for checkpoint in saved:
        model, optim = fresh(checkpoint)
        random.seed(1)
        assert resume(checkpoint, (model, optim)).step == 1
        reference = torch.load(saved[1] / "model.pt", weights_only=True)
        for key, value in model.state_dict().items():
            assert torch.equal(value, reference[key]), key
        assert optim.state_dict()["param_groups"][0]["lr"] > 0 and len(optim.state_dict()["state"]) > 0
        rng = torch.load(checkpoint / "rng" / "rank0.pt", weights_only=True)  # plain data: no numpy inside
        assert random.getstate() == rng["python"] and torch.equal(torch.get_rng_state(), rng["torch"])
        assert np.array_equal(np.random.get_state()[1], rng["numpy"]["state"]["key"].numpy())


def test_old_checkpoint_without_checksums_loads_with_a_warning(
    sharded: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (sharded / "checksums.json").unlink()
    np.random.seed(7)  # rng files of older checkpoints held numpy's state as an array
    old = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    torch.save(old, sharded / "rng" / "rank0.pt")
    model_and_optim = fresh(sharded)
    np.random.seed(8)
    assert resume(sharded, model_and_optim).step == 1
    assert f"{sharded}: no checksums.json (saved before checksums were recorded)" in caplog.text
    assert np.array_equal(np.random.get_state()[1], old["numpy"][1])  # restored, with weights_only=True
    code, out = verify_cli(str(sharded))
    assert code == 0 and "not checked: no checksums.json" in out
    code, out = verify_cli(str(sharded), "--strict")
    assert code == 2 and "no checksums.json" in out
    assert unshard(sharded, tmp_path / "out").is_dir()


def test_old_checkpoint_without_checksums_downloads_with_a_warning(
    sharded: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (sharded / "checksums.json").unlink()
    url, _ = serve(sharded, http_root, monkeypatch)
    local = ckpt.localize(url, SINGLE)
    assert "no checksums.json (saved before checksums existed): the download cannot be checked" in caplog.text
    assert sorted(p.name for p in local.iterdir()) == [".metadata", SHARD, "config.yaml", "trainer_state.json"]
    assert resume(local).step == 1


def test_download_fetches_every_listed_file_checked(
    sharded: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, _ = serve(sharded, http_root, monkeypatch)
    local = ckpt.localize(url, SINGLE)
    for name in json.loads((sharded / "checksums.json").read_text())["files"]:
        assert (local / name).read_bytes() == (sharded / name).read_bytes(), name
    code, out = verify_cli(url, "--strict")
    assert code == 0 and out.startswith(f"OK {local}: sharded checkpoint of step 1: 5 files"), out


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(olmo_train_cli, ["verify", "--help"])
    assert result.exit_code == 0 and "olmo-train verify runs/tiny/step100" in result.output
    assert "--strict" in result.output
    assert "verify" in CliRunner().invoke(olmo_train_cli, ["--help"]).output


# ---- 2 processes under torchrun, FSDP ---------------------------------------------------------------------------


@pytest.mark.slow
def test_fsdp_resume_refuses_crafted_and_corrupt_checkpoints(tmp_path: Path) -> None:
    """A 2-rank run saved at step 2, then resumed with a `.metadata` that runs a command and with a flipped byte:
    both ranks stop with the one-line error (none waits for the other), nothing runs; the intact copy resumes."""
    data = write_tokens(tmp_path / "tokens")
    config = tiny_config(tmp_path, data, max_duration=2, save_interval=2)
    launch(config, 2)
    step2 = tmp_path / "run" / "step2"
    intact = tmp_path / "intact"
    shutil.copytree(step2, intact)
    assert json.loads((step2 / "checksums.json").read_text())["files"].keys() >= {"rng/rank0.pt", "rng/rank1.pt"}

    def resume_fails(match: str) -> None:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m"]
        cmd += ["olmo_train", str(config), "--max_duration=3"]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
        assert proc.returncode != 0 and match in proc.stderr, proc.stderr[-3000:]
        assert not (tmp_path / "run" / "step3").exists()

    marker = tmp_path / "MARKER"
    forge(step2, ".metadata", pickle.dumps(RunsCommand(marker)))
    resume_fails(f"error: {step2 / '.metadata'}: refers to {SYSTEM}")
    assert not marker.exists()

    shutil.rmtree(step2)
    shutil.copytree(intact, step2)
    resume_fails(f"error: {flip_a_weight_byte(step2)}: sha256 ")

    shutil.rmtree(step2)
    shutil.copytree(intact, step2)
    launch(config, 2, "--max_duration=3")
    assert (tmp_path / "run" / "step3" / "checksums.json").is_file()


def test_import_hf_writes_checksums(saved: tuple[Path, Path], tmp_path: Path) -> None:
    from olmo_train.convert import import_hf

    exported = export_hf(saved[1], tmp_path / "hf")
    imported = import_hf(str(exported), tmp_path / "imported")
    code, out = verify_cli(str(imported), "--strict")
    assert code == 0 and out.startswith(f"OK {imported}: unsharded checkpoint of step 0: "), out
    listed = json.loads((imported / "checksums.json").read_text())["files"]
    assert {"model.pt", "config.yaml", "trainer_state.json"} <= set(listed)


def test_a_writer_that_seeks_back_is_still_hashed_right(tmp_path: Path) -> None:
    from olmo_train.checkpoint.integrity import hashing_open

    with hashing_open(tmp_path / "f") as (stream, record):
        stream.write(b"hello world")
        stream.seek(0)
        stream.write(b"J")
    assert (tmp_path / "f").read_bytes() == b"Jello world" and record == hash_file(tmp_path / "f")
