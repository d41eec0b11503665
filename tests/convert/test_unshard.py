"""`olmo-train unshard`: a sharded checkpoint, unsharded in one process, is the trainer's own unsharded checkpoint
of that step, tensor for tensor, and a run continues from it as from the trainer's. Bad input leaves nothing
behind: no destination, no `.tmp-` directory."""

from __future__ import annotations

import json
import logging
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.config import OptimizerConfig, load_config
from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.convert import unshard
from olmo_train.distributed import Dist
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer
from tests.train.test_train_e2e import GBS, SEQ, launch, metrics, tiny_config, write_tokens

SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
SMALL = {"d_model": 16, "n_heads": 2, "n_layers": 1, "vocab_size": 64, "max_sequence_length": 16}


def load(path: Path) -> Any:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_checkpoint(ours: Path, trainers: Path, *, model_only: bool = False) -> None:
    """Every file the trainer's save_unsharded writes, compared with ours: tensors with torch.equal, key for key."""
    mine, theirs = load(ours / "model.pt"), load(trainers / "model.pt")
    assert list(mine) == list(theirs)
    for key in theirs:
        assert type(mine[key]) is torch.Tensor, key  # plain tensors, no DTensor
        assert mine[key].dtype == theirs[key].dtype and torch.equal(mine[key], theirs[key]), key
    if model_only:
        assert not (ours / "optim.pt").exists()
    else:
        mine, theirs = load(ours / "optim.pt"), load(trainers / "optim.pt")
        assert list(mine) == ["state", "param_groups"] == list(theirs)
        assert mine["param_groups"] == theirs["param_groups"]
        assert list(mine["state"]) == list(theirs["state"])
        for param, fields in theirs["state"].items():
            assert set(mine["state"][param]) == set(fields), param
            for name, value in fields.items():
                assert torch.equal(mine["state"][param][name], value), (param, name)
    for name in ("trainer_state.json", "config.yaml", "rng/rank0.pt"):
        assert (ours / name).read_bytes() == (trainers / name).read_bytes(), name
    assert sorted(p.name for p in ours.iterdir()) == sorted(
        p.name for p in trainers.iterdir() if not (model_only and p.name == "optim.pt")
    )


def no_leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".tmp-"))


# ---- one process, no torchrun: a checkpoint saved by the trainer's own save functions -------------------------


def save_both(folder: Path, tied: bool) -> tuple[Path, Path]:
    """stepN/ and stepN-unsharded/ of one model after one AdamW step, as the trainer saves them (world of one)."""
    cfg_path = tiny_config(folder.parent, ["unused.npy"], model={**SMALL, "weight_tying": tied})
    cfg = load_config(cfg_path, require_data=False)
    torch.manual_seed(0)
    model = Transformer(cfg.model)
    optim = build_optimizer(model, cfg.optimizer)
    model(torch.randint(0, 64, (2, 8))).float().logsumexp(-1).sum().backward()
    optim.step()
    state = ckpt.TrainerState(step=1, seed=cfg.seed, global_train_batch_size=cfg.global_train_batch_size)
    with warnings.catch_warnings():  # DCP without a process group warns that it saves from one process
        warnings.simplefilter("ignore")
        sharded = ckpt.save_sharded(folder, model, optim, state, -1, SINGLE, cfg)
    unsharded = ckpt.save_unsharded(folder, model, optim, state, -1, SINGLE, cfg)
    return sharded, unsharded


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return save_both(tmp_path_factory.mktemp("small") / "run", tied=True)


@pytest.fixture
def sharded_copy(small: tuple[Path, Path], tmp_path: Path) -> Path:
    """A private copy of the small sharded checkpoint (step1), to damage."""
    copy = tmp_path / "run" / "step1"
    shutil.copytree(small[0], copy)
    return copy


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_one_process_checkpoint_unshards_to_the_trainers_files(
    tied: bool,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sharded, unsharded = save_both(tmp_path / "run", tied)
    caplog.set_level(logging.DEBUG, logger="olmo_train.convert.unshard")
    monkeypatch.setenv("OLMO_PROGRESS", "1")  # the bar, as a terminal shows it
    out = unshard(sharded, tmp_path / "out")
    assert out == tmp_path / "out"
    done = [r.getMessage() for r in caplog.records if r.name == "olmo_train.convert.unshard"]
    assert done[0].startswith("model.pt done in ") and done[-1].startswith("optim.pt done in "), done
    bar = capsys.readouterr().err
    assert "reading model" in bar and "writing optim.pt" in bar and re.search(r"unshard: 100%\|", bar), bar
    assert_same_checkpoint(out, unsharded)
    model = load(out / "model.pt")
    assert ("lm_head.weight" in model) and torch.equal(model["lm_head.weight"], model["embeddings.weight"]) == tied
    assert no_leftovers(tmp_path) == []


def test_default_destination_is_beside_the_resolved_checkpoint(sharded_copy: Path) -> None:
    """`latest` names the newest step; its unsharded copy goes to stepN-unsharded, not over `latest-unsharded`."""
    run = sharded_copy.parent
    (run / "latest").symlink_to("step1")
    out = unshard(run / "latest")
    assert out == run / "step1-unsharded"
    assert (out / "trainer_state.json").is_file() and (out / "optim.pt").is_file()
    assert ckpt.latest_checkpoint(run) == sharded_copy  # sharded is still preferred at the same step
    assert [(s, u) for s, u, _ in ckpt.list_checkpoints(run)] == [(1, False), (1, True)]


def test_leftover_of_an_interrupted_unshard_is_replaced(sharded_copy: Path, tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-out"
    stale.mkdir()
    (stale / "model.pt").write_bytes(b"half a file")
    out = unshard(sharded_copy, tmp_path / "out", model_only=True)
    assert load(out / "model.pt")["norm.weight"].shape == (16,)
    assert no_leftovers(tmp_path) == []


def test_cli_prints_the_destination_and_a_summary(sharded_copy: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(olmo_train_cli, ["unshard", str(sharded_copy), "--destination", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == str(tmp_path / "o")
    assert "unsharded step 1 (model.pt " in result.stderr and "optim.pt " in result.stderr
    assert (tmp_path / "o" / "optim.pt").is_file()


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(olmo_train_cli, ["unshard", "--help"])
    assert result.exit_code == 0
    assert "olmo-train unshard runs/tiny/step100 " in result.output and "--model-only" in result.output


def test_model_only_loads_weights_and_refuses_a_resume_by_name(small: tuple[Path, Path], tmp_path: Path) -> None:
    result = CliRunner().invoke(
        olmo_train_cli, ["unshard", str(small[0]), "--destination", str(tmp_path / "w"), "--model-only"]
    )
    assert result.exit_code == 0, result.output
    out = tmp_path / "w"
    assert_same_checkpoint(out, small[1], model_only=True)

    cfg = load_config(out / "config.yaml", require_data=False)
    model = Transformer(cfg.model)
    ckpt.load_checkpoint(out, model, None, SINGLE, restore_rng=False)  # what --reset_trainer_state does
    for key, value in load(small[1] / "model.pt").items():
        assert torch.equal(model.state_dict()[key], value), key

    optim = build_optimizer(model, OptimizerConfig())
    with pytest.raises(DataError) as e:
        ckpt.load_checkpoint(out, model, optim, SINGLE)
    message = str(e.value)
    assert str(out / "optim.pt") in message and "no optimizer state" in message
    assert f"--load_path={out} --reset_trainer_state --reset_optimizer_state=true" in message


# ---- bad input: a message naming the problem, and nothing left behind ----------------------------------------


def refused(checkpoint: Path, destination: Path, match: str, *, via_cli: bool = False) -> None:
    existed = destination.exists()
    if via_cli:
        result = CliRunner().invoke(olmo_train_cli, ["unshard", str(checkpoint), "--destination", str(destination)])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: ") and match in result.stderr, result.stderr
    else:
        with pytest.raises(DataError, match=re.escape(match)):
            unshard(checkpoint, destination)
    assert destination.exists() == existed
    assert no_leftovers(destination.parent) == []


def test_refuses_what_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    refused(tmp_path / "nowhere", tmp_path / "out", f"{tmp_path / 'nowhere'}: no such checkpoint directory")
    refused(tmp_path / "empty", tmp_path / "out", "not a complete checkpoint (no trainer_state.json", via_cli=True)


def test_refuses_an_incomplete_checkpoint(sharded_copy: Path, tmp_path: Path) -> None:
    (sharded_copy / "trainer_state.json").unlink()
    refused(sharded_copy, tmp_path / "out", f"{sharded_copy}: not a complete checkpoint (no trainer_state.json")


def test_refuses_an_unsharded_checkpoint(small: tuple[Path, Path], tmp_path: Path) -> None:
    refused(small[1], tmp_path / "out", f"{small[1]}: already unsharded (it holds model.pt)", via_cli=True)


def test_refuses_an_existing_destination(sharded_copy: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    refused(sharded_copy, tmp_path / "taken", f"{tmp_path / 'taken'}: the destination exists")
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    refused(sharded_copy, tmp_path / "dangling", "the destination exists", via_cli=True)


def test_refuses_a_missing_shard_file(sharded_copy: Path, tmp_path: Path) -> None:
    (sharded_copy / "__0_0.distcp").unlink()
    shard = sharded_copy / "__0_0.distcp"
    refused(sharded_copy, tmp_path / "out", f"{shard}: missing, though checksums.json lists it", via_cli=True)
    (sharded_copy / "checksums.json").unlink()  # saved before checksums existed: the metadata names it
    refused(sharded_copy, tmp_path / "out", f"{sharded_copy}: shard file __0_0.distcp is missing", via_cli=True)


def test_refuses_a_truncated_shard_file(sharded_copy: Path, tmp_path: Path) -> None:
    shard = sharded_copy / "__0_0.distcp"
    size = shard.stat().st_size
    with shard.open("r+b") as f:
        f.truncate(size - 100)  # only the end: the optimizer state, which --model-only would not even read
    refused(sharded_copy, tmp_path / "out", f"{shard}: truncated ({size - 100} bytes, checksums.json records {size})")
    (sharded_copy / "checksums.json").unlink()
    refused(sharded_copy, tmp_path / "out", f"shard file __0_0.distcp is truncated ({size - 100} bytes")


def test_a_corrupt_shard_is_named_before_anything_is_written(sharded_copy: Path, tmp_path: Path) -> None:
    """Damage the size check cannot see (bytes overwritten in the optimizer part): refused by checksums.json
    before anything is written. Without checksums.json (an older checkpoint), the read fails after model.pt was
    written, and the half-written directory is removed."""
    shard = sharded_copy / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[-300:] = b"\0" * 300
    shard.write_bytes(bytes(data))
    refused(sharded_copy, tmp_path / "out", f"{shard}: sha256 ")
    (sharded_copy / "checksums.json").unlink()
    refused(sharded_copy, tmp_path / "out", f"{shard}: not readable as a checkpoint shard (RuntimeError: ")


# ---- 2 processes under torchrun, FSDP: the real thing --------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_tokens(tmp_path_factory.mktemp("tokens"))


def fsdp_run(tmp: Path, data: list[str], tied: bool, steps: int) -> Path:
    """A 2-process FSDP run that saves step2/ and step2-unsharded/ at the same step."""
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ}
    overrides = {"model": {**model, "weight_tying": tied}, "save_interval": 2, "save_interval_unsharded": 2}
    launch(tiny_config(tmp, data, max_duration=steps, **overrides), 2)
    return tmp / "run"


@pytest.fixture(scope="module")
def tied_run(data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs to step 3, so that step 3's loss is the reference for a run continued from step 2."""
    return fsdp_run(tmp_path_factory.mktemp("tied"), data, tied=True, steps=3)


@pytest.fixture(scope="module")
def untied_run(data: list[str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fsdp_run(tmp_path_factory.mktemp("untied"), data, tied=False, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["tied_run", "untied_run"])
def test_fsdp_checkpoint_unshards_to_the_trainers_files(run_name: str, request: Any, tmp_path: Path) -> None:
    run: Path = request.getfixturevalue(run_name)
    assert json.loads((run / "step2" / "trainer_state.json").read_text())["world_size"] == 2
    by_function = unshard(run / "step2", tmp_path / "fn")
    assert_same_checkpoint(by_function, run / "step2-unsharded")

    result = CliRunner().invoke(olmo_train_cli, ["unshard", str(run / "step2"), "--destination", str(tmp_path / "cli")])
    assert result.exit_code == 0, result.output
    assert_same_checkpoint(tmp_path / "cli", run / "step2-unsharded")

    model = load(by_function / "model.pt")
    assert torch.equal(model["lm_head.weight"], model["embeddings.weight"]) == (run_name == "tied_run")
    # the default destination is the trainer's own step2-unsharded: refused, untouched
    before = (run / "step2-unsharded" / "model.pt").read_bytes()
    refused(run / "step2", run / "step2-unsharded", "the destination exists", via_cli=True)
    with pytest.raises(DataError, match=re.escape(f"{run / 'step2-unsharded'}: the destination exists")):
        unshard(run / "step2")
    assert (run / "step2-unsharded" / "model.pt").read_bytes() == before


@pytest.mark.slow
def test_a_run_continues_from_the_unsharded_result(tied_run: Path, data: list[str], tmp_path: Path) -> None:
    """Step 3 of a 1-process run continued from our unsharded step 2 is step 3 of the 2-process run (up to the
    order of the loss sums, which depends on the world size)."""
    out = unshard(tied_run / "step2", tmp_path / "step2-unsharded")
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ}
    config = tiny_config(
        tmp_path,
        data,
        max_duration=3,
        save_interval=2,
        model={**model, "weight_tying": True},
        load_path=str(out),
    )
    launch(config, 1)
    reference, continued = metrics(tied_run), metrics(tmp_path / "run")
    assert [m["step"] for m in continued] == [3]
    ref = reference[2]
    assert ref["step"] == 3
    got = continued[0]
    assert got["train/batch_fingerprint"] == ref["train/batch_fingerprint"]
    assert got["train/tokens_seen"] == ref["train/tokens_seen"] == 3 * GBS * SEQ
    assert got["optim/lr"] == ref["optim/lr"]
    assert got["train/loss"] == pytest.approx(ref["train/loss"], rel=1e-6)
    # not a run from scratch: step 1's loss is far from step 3's
    assert abs(reference[0]["train/loss"] - got["train/loss"]) > 1e-3


@pytest.mark.slow
def test_model_only_result_fine_tunes_with_reset_trainer_state(tied_run: Path, data: list[str], tmp_path: Path) -> None:
    out = unshard(tied_run / "step2", tmp_path / "weights", model_only=True)
    assert not (out / "optim.pt").exists()
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": SEQ}
    config = tiny_config(tmp_path, data, max_duration=1, model={**model, "weight_tying": True}, load_path=str(out))
    launch(config, 1, "--reset_trainer_state")
    assert [m["step"] for m in metrics(tmp_path / "run")] == [1]  # a fresh run from the loaded weights
    # from step 2's weights, batch 1 is already partly learned: below the loss of the untrained model
    assert metrics(tmp_path / "run")[0]["train/loss"] < metrics(tied_run)[0]["train/loss"]
