"""`olmo-train soup`: OLMo 2's souping of stage-2 anneals. Two anneals of one stage-1 checkpoint (one saved
unsharded, one sharded), averaged: the soup's weights are their (weighted) mean, it verifies, exports to
transformers, loads for generation and fine-tunes; mismatches are refused by name and leave nothing behind."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from olmo_data.errors import DataError
from olmo_train import checkpoint as ckpt
from olmo_train.convert import export_hf, load_model, read_model_state
from olmo_train.train import main
from tests.helpers import small_disk

SEQ, GBS = 16, 4
MODEL = {"d_model": 16, "n_heads": 2, "n_layers": 2, "vocab_size": 64, "max_sequence_length": SEQ}


def tokens(directory: Path, seed: int) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "part-0.npy"
    np.random.default_rng(seed).integers(0, 64, 20 * SEQ).astype(np.uint16).tofile(path)
    return str(path)


def train(tmp: Path, name: str, data: str, **keys: Any) -> Path:
    cfg: dict[str, Any] = {
        "run_name": name,
        "save_folder": str(tmp / name),
        "max_duration": 3,
        "global_train_batch_size": GBS,
        "device_train_microbatch_size": GBS,
        "distributed_strategy": "single",
        "save_interval": 100,
        "model": MODEL,
        "data": {"paths": [data]},
        **keys,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main([str(path)]) == 0
    return tmp / name


@pytest.fixture(scope="module")
def anneals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Stage 1 (3 steps), then two 2-step anneals from its last checkpoint on other data with other seeds
    (OLMo 2's restore_dataloader: false), one saving unsharded, one sharded."""
    tmp = tmp_path_factory.mktemp("soup")
    stage1 = train(tmp, "stage1", tokens(tmp / "web", 0)) / "step3"
    anneal = {"load_path": str(stage1), "restore_dataloader": False, "max_duration": 2}
    a = train(tmp, "anneal-42", tokens(tmp / "math-a", 1), seed=42, save_interval_unsharded=2, **anneal)
    b = train(tmp, "anneal-666", tokens(tmp / "math-b", 2), seed=666, **anneal)
    return {"tmp": tmp, "stage1": stage1, "a": a / "step2-unsharded", "b": b / "step2"}


def mean_of(paths: list[Path], weights: list[float]) -> dict[str, torch.Tensor]:
    """The reference: whole state dicts, averaged in float64."""
    states = [read_model_state(p) for p in paths]
    return {k: sum(w * s[k].double() for s, w in zip(states, weights, strict=True)) for k in states[0]}  # type: ignore[misc]


@pytest.mark.parametrize("weights", [None, "1,3"])
def test_the_soup_is_the_weighted_mean_and_passes_verify(anneals: dict[str, Path], weights: str | None) -> None:
    dest = anneals["tmp"] / f"soup-{weights}"
    parents = [str(anneals["a"]), str(anneals["b"])]
    ckpt.average_checkpoints(parents, dest, ckpt.parse_weights(weights, 2))
    w = [0.5, 0.5] if weights is None else [0.25, 0.75]
    expected = mean_of([anneals["a"], anneals["b"]], w)
    got = ckpt.read_stored_model(dest)
    assert set(got) == set(expected)
    for name, tensor in got.items():
        assert tensor.dtype == torch.float32
        assert torch.allclose(tensor.double(), expected[name], atol=1e-6, rtol=0), name
    assert not torch.equal(got["embeddings.weight"], read_model_state(anneals["a"])["embeddings.weight"])
    assert "unsharded checkpoint of step 0" in ckpt.verify_checkpoint(str(dest), strict=True)
    lineage = ckpt.read_trainer_state(dest).lineage
    assert [(r["source"], r["given"], r["weight"]) for r in lineage] == [
        ("soup", p, x) for p, x in zip(parents, w, strict=True)
    ]
    assert [r["run_name"] for r in lineage] == ["anneal-42", "anneal-666"]
    assert [r["resolved"] for r in lineage] == [str(anneals["a"].resolve()), str(anneals["b"].resolve())]
    assert all(r["lineage"][0]["resolved"] == str(anneals["stage1"].resolve()) for r in lineage)


@pytest.mark.parametrize("raw", [[1.0, 3.0], [5e307, 1.5e308]])
def test_raw_weights_are_normalised_inside(anneals: dict[str, Path], raw: list[float]) -> None:
    """A caller of the library (not the CLI) giving unnormalised weights gets the weighted mean, not the sum; weights
    whose sum overflows float still give the mean, not an all-zero soup."""
    dest = anneals["tmp"] / f"soup-raw-{raw[0]:g}"
    ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], dest, raw)
    expected = mean_of([anneals["a"], anneals["b"]], [0.25, 0.75])
    got = ckpt.read_stored_model(dest)
    for name, tensor in got.items():
        assert torch.allclose(tensor.double(), expected[name], atol=1e-6, rtol=0), name
    assert [r["weight"] for r in ckpt.read_trainer_state(dest).lineage] == pytest.approx([0.25, 0.75])


@pytest.mark.slow
def test_the_soup_exports_generates_and_fine_tunes(anneals: dict[str, Path]) -> None:
    tmp = anneals["tmp"]
    dest = ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], tmp / "soup")
    hf = export_hf(dest, tmp / "soup-hf")
    from safetensors.torch import load_file

    exported = load_file(str(hf / "model.safetensors"))
    assert torch.equal(exported["model.embed_tokens.weight"], ckpt.read_stored_model(dest)["embeddings.weight"])
    model, _ = load_model(dest)
    assert torch.isfinite(model(torch.tensor([[1, 2, 3]]))).all()
    saved = yaml.safe_load((dest / ckpt.CONFIG).read_text())
    assert saved["load_path"] == str(dest.resolve()) and saved["reset_trainer_state"] is True
    ft = train(tmp, "finetune", tokens(tmp / "sft", 3), load_path=str(dest), reset_trainer_state=True, max_duration=1)
    (parent,) = ckpt.read_trainer_state(ft / "step1").lineage
    assert parent["source"] == "checkpoint" and parent["resolved"] == str(dest.resolve())
    assert [r["run_name"] for r in parent["lineage"]] == ["anneal-42", "anneal-666"]


def test_mismatches_are_refused_by_name_and_leave_nothing(anneals: dict[str, Path]) -> None:
    tmp = anneals["tmp"]
    other = train(tmp, "wider", tokens(tmp / "w", 4), model={**MODEL, "d_model": 32}, max_duration=1) / "step1"
    dest = tmp / "refused"
    with pytest.raises(DataError, match=r"model\.d_model is 32, but .*anneal-42/step2-unsharded has 16; a soup"):
        ckpt.average_checkpoints([str(anneals["a"]), str(other)], dest)
    with pytest.raises(DataError, match=r"--weights '1': 1 weights for 2 checkpoints; give one per checkpoint"):
        ckpt.parse_weights("1", 2)
    with pytest.raises(DataError, match=r"--weights '1,x': expected comma-separated numbers"):
        ckpt.parse_weights("1,x", 2)
    with pytest.raises(DataError, match=r"--weights '0,0': weights must be finite, 0 or more, and not all 0"):
        ckpt.parse_weights("0,0", 2)
    with pytest.raises(DataError, match=r"--weights '1e308,inf': weights must be finite, 0 or more, and not all 0"):
        ckpt.parse_weights("1e308,inf", 2)
    with pytest.raises(DataError, match=r"weights: weights must be finite, 0 or more, and not all 0"):
        ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], dest, [1.0, -1.0])
    with pytest.raises(DataError, match=r"weights: 3 weights for 2 checkpoints"):
        ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], dest, [1.0, 1.0, 1.0])
    with pytest.raises(DataError, match=r"a soup needs two checkpoints or more, got 1"):
        ckpt.average_checkpoints([str(anneals["a"])], dest)
    assert not os.path.lexists(dest) and not any(p.name.startswith(".tmp-") for p in tmp.iterdir())
    dest.mkdir()
    with pytest.raises(DataError, match=r"refused: the destination exists"):
        ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], dest)


def test_the_command(anneals: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from olmo_cli.train_main import main as olmo_train

    monkeypatch.chdir(anneals["tmp"])  # where a remote destination taken for a local path would be written

    dest = anneals["tmp"] / "soup-cli"
    args = ["soup", str(anneals["a"]), str(anneals["b"]), "--destination", str(dest), "--weights", "2,2"]
    result = CliRunner().invoke(olmo_train, args)
    assert result.exit_code == 0, result.output
    assert [r["weight"] for r in ckpt.read_trainer_state(dest).lineage] == [0.5, 0.5]
    result = CliRunner().invoke(olmo_train, [*args[:-1], "1,2,3"])
    assert result.exit_code == 2 and "error: --weights '1,2,3': 3 weights for 2 checkpoints" in result.output
    result = CliRunner().invoke(olmo_train, [*args[:3], "--destination", "s3://bkt/soup"])
    assert result.exit_code == 2 and "error: --destination s3://bkt/soup: a soup is written to a local" in result.output
    assert not os.path.lexists("s3:")
    result = CliRunner().invoke(olmo_train, ["verify", "--lineage", str(dest)])
    assert result.exit_code == 0 and "<- soup: anneal-42 step 2" in result.output, result.output


def test_a_parent_by_url(anneals: dict[str, Path], http_root: tuple[Path, str]) -> None:
    root, url = http_root
    shutil.copytree(anneals["a"], root / "a")
    dest = ckpt.average_checkpoints([f"{url}/a", str(anneals["b"])], anneals["tmp"] / "soup-url")
    local = ckpt.average_checkpoints([str(anneals["a"]), str(anneals["b"])], anneals["tmp"] / "soup-local")
    reference = ckpt.read_stored_model(local)
    assert all(torch.equal(t, reference[k]) for k, t in ckpt.read_stored_model(dest).items())
    assert ckpt.read_trainer_state(dest).lineage[0]["resolved"] == f"{url}/a"


def test_a_full_disk_under_the_destination_is_one_line(
    anneals: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from olmo_cli.train_main import main as olmo_train

    size = (anneals["a"] / ckpt.MODEL_FILE).stat().st_size
    with small_disk(tmp_path / "disk", f"{size // 2048}k") as real:
        if not real:  # no tmpfs: the model file's writes are refused as a full disk refuses them
            monkeypatch.setattr(
                "olmo_train.checkpoint.soup.stream_model_file",
                lambda *a, **k: (_ for _ in ()).throw(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
            )
        dest = tmp_path / "disk" / "soup"
        args = ["soup", str(anneals["a"]), str(anneals["b"]), "--destination", str(dest)]
        result = CliRunner().invoke(olmo_train, args)
        assert result.exit_code == 2 and "Traceback" not in result.output and result.output.count("\n") == 1, result
        assert result.output.startswith(f"error: {dest}: the disk is full (No space left on device); the partial ")
        assert "free space there and rerun" in result.output
        assert list((tmp_path / "disk").iterdir()) == []
