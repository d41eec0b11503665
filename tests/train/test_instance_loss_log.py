"""instance_loss.bin: the trainer's writer and olmo_data's reader agree, a resume keeps exactly the rows up to its
checkpoint (the rest, and a row cut short, set aside whole), and per-source sums average to the step's loss."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from olmo_data.dataset.instances import open_dataset
from olmo_data.dataset.sources import Sources
from olmo_data.errors import DataError
from olmo_data.run.instance_loss import ROW, read_rows, step_losses
from olmo_data.run.layout import instance_loss_aside as aside_name
from olmo_train.train.instance_losses import InstanceLossLog, source_metrics

GBS = 6


def step_values(step: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(step)
    tokens = rng.integers(0, 40, GBS)
    return rng.random(GBS) * tokens * 3, tokens


def write_steps(path: Path, resume: int, steps: range) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    log = InstanceLossLog(path, enabled=True)
    log.start(resume)
    for step in steps:
        log.write(step, *step_values(step))
    log.close()


def test_rows_read_back_by_step(tmp_path: Path) -> None:
    path = tmp_path / "instance_loss.bin"
    write_steps(path, 0, range(1, 6))
    assert path.stat().st_size == 5 * GBS * 20 == 5 * GBS * ROW.itemsize
    for step in range(1, 6):
        got = step_losses(path, step)
        loss_sum, tokens = step_values(step)
        assert got is not None and got.step == step
        np.testing.assert_array_equal(got.tokens, tokens)
        np.testing.assert_array_equal(got.loss_sum, loss_sum)
        with np.errstate(invalid="ignore", divide="ignore"):
            np.testing.assert_array_equal(got.loss, np.where(tokens > 0, loss_sum / tokens, np.nan))
    assert step_losses(path, 6) is None and step_losses(tmp_path / "none.bin", 1) is None


def test_resume_keeps_rows_up_to_the_checkpoint_and_sets_the_rest_aside(tmp_path: Path) -> None:
    unbroken = tmp_path / "a" / "instance_loss.bin"
    write_steps(unbroken, 0, range(1, 9))
    path = tmp_path / "b" / "instance_loss.bin"
    write_steps(path, 0, range(1, 6))  # trained to 5, but its last checkpoint is step 3 (killed)
    with path.open("ab") as f:
        f.write(b"\x07" * 9)  # a row cut short by the kill
    before = path.read_bytes()
    write_steps(path, 3, range(4, 9))  # the resumed run trains 4..8
    assert path.read_bytes() == unbroken.read_bytes()  # no gap, no step twice
    assert (path.parent / aside_name(1)).read_bytes() == before  # every row any run wrote is still on disk
    write_steps(path, 8, range(9, 9))  # a plain continuation: nothing set aside
    assert not (path.parent / aside_name(2)).exists() and path.read_bytes() == unbroken.read_bytes()
    write_steps(path, 0, range(1, 3))  # a fresh start in the same folder: the old file goes aside whole
    assert (path.parent / aside_name(2)).read_bytes() == unbroken.read_bytes()
    assert read_rows(path)["step"].tolist() == [1] * GBS + [2] * GBS


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "instance_loss.bin"
    rows = np.zeros(3, dtype=ROW)
    rows["step"] = 1
    rows["position"] = [0, 2, 1]
    path.write_bytes(rows.tobytes())
    with pytest.raises(DataError, match=r"instance_loss.bin: step 1's rows are not positions 0..2 in order"):
        step_losses(path, 1)


def test_per_source_losses_average_to_the_step_loss(tmp_path: Path) -> None:
    paths = [tmp_path / "code.npy", tmp_path / "books.npy"]
    for i, p in enumerate(paths):
        np.arange(40 * (i + 1), dtype=np.uint16).tofile(p)
    source = open_dataset([str(p) for p in paths], sequence_length=8)
    sources = Sources(source, [str(p) for p in paths])
    assert sources.labels == ["code", "books"]
    ids = sources.of(np.arange(len(source)))
    assert ids.tolist() == [0] * 5 + [1] * 10  # 5 instances of 8 tokens in code.npy, then books.npy's 10
    loss_sum, tokens = step_values(3)
    record = source_metrics(sources.labels, np.array([0, 1, 1, 0, 1, 1]), loss_sum, tokens)
    weighted = sum(
        record[f"train/source/{s}/loss"] * record[f"train/source/{s}/supervised_tokens"] for s in ["code", "books"]
    )
    assert (
        record["train/source/code/supervised_tokens"] + record["train/source/books/supervised_tokens"] == tokens.sum()
    )
    assert weighted / tokens.sum() == pytest.approx(loss_sum.sum() / tokens.sum(), rel=1e-12)
    assert record["train/source/code/supervised_tokens"] == tokens[[0, 3]].sum()


def test_mix_sources_are_named_by_the_mix(tmp_path: Path) -> None:
    """Through a mix, each instance's source is the mix source its tokens came from (read back from the tokens:
    make_source writes 1,000,000-based ids for web, 2,000,000-based for code)."""
    from olmo_data.dataset.mixture import build_mix, parse_spec
    from tests.data.dataset.test_mixture import make_source, spec

    paths = {
        "web": make_source(tmp_path / "web", "web", [403, 205], 1_000_000),
        "code": make_source(tmp_path / "code", "code", [161], 2_000_000),
    }
    build_mix(parse_spec(spec(paths)), str(tmp_path / "mix"))
    source = open_dataset(sequence_length=8, mix=str(tmp_path / "mix"))
    sources = Sources(source, None)
    assert sources.labels == ["web", "code"]
    indices = np.arange(len(source))
    tokens, _ = source.get_batch(indices)
    expected = np.where(tokens[:, 0] >= 2_000_000, 1, 0)
    np.testing.assert_array_equal(sources.of(indices), expected)
    assert 0 < expected.sum() < len(expected)


def test_a_resume_past_the_files_last_step_sets_it_aside(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rows of steps 1-2, a resume at step 10: continuing would leave steps 3-10 missing, so the file goes aside."""
    path = tmp_path / "instance_loss.bin"
    write_steps(path, 0, range(1, 3))
    before = path.read_bytes()
    with caplog.at_level("WARNING", logger="olmo_train"):
        write_steps(path, 10, range(11, 12))
    assert read_rows(path)["step"].tolist() == [11] * GBS
    assert (tmp_path / aside_name(1)).read_bytes() == before
    assert "ends at step 2, before step 10, where this run resumes" in caplog.text


def test_an_entry_listed_twice_is_two_sources_of_its_own_files(tmp_path: Path) -> None:
    """OLMo upsamples by listing a path again: [x, x, y], or a file and then its directory [A/x.npy, A]."""
    import json

    folder = tmp_path / "A"
    folder.mkdir()
    for name, n in (("x", 40), ("y", 24)):
        np.arange(n, dtype=np.uint16).tofile(folder / f"{name}.npy")
    files = [{"path": "x.npy", "tokens": 40}, {"path": "y.npy", "tokens": 24}]
    (folder / "manifest.json").write_text(json.dumps({"dtype": "uint16", "files": files}))
    x, y = str(folder / "x.npy"), str(folder / "y.npy")
    for paths, labels, per_file in (
        ([x, x, y], ["x.0", "x.1", "y"], [0, 1, 2]),
        ([x, str(folder)], ["x", "A"], [0, 1, 1]),
    ):
        source = open_dataset(paths, sequence_length=8)
        sources = Sources(source, paths)
        assert sources.labels == labels
        assert sources.file_source.tolist() == per_file
        assert np.bincount(sources.of(np.arange(len(source)))).tolist() == [
            sum(f.num_tokens // 8 for f, s in zip(source.files, per_file, strict=True) if s == k)
            for k in range(len(labels))
        ]


def test_source_labels_never_collide(tmp_path: Path) -> None:
    paths = []
    for folder, name in (("a", "train"), ("b", "train"), ("c", "train.1")):
        (tmp_path / folder).mkdir()
        paths.append(str(tmp_path / folder / f"{name}.npy"))
        np.arange(16, dtype=np.uint16).tofile(paths[-1])
    sources = Sources(open_dataset(paths, sequence_length=8), paths)
    assert len(set(sources.labels)) == 3 and sources.labels[:2] == ["train.0", "train.1"]
    record = source_metrics(sources.labels, np.array([0, 1, 2]), np.array([10.0, 20.0, 90.0]), np.full(3, 10))
    assert sorted(v for k, v in record.items() if k.endswith("/loss")) == [1.0, 2.0, 9.0]
