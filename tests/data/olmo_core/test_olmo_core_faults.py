"""The fault matrix of OLMo-core runs (issue 41): each bad config.json, order file or token directory, through every
data command that reads it (inspect-batch, trace, stats, build-order; spikes where it reads the file at all), and
each bad checkpoint config through import-olmo-core. Every case must end in one line naming the file or key and what
disagrees (both sides where there are two), exit 2, no traceback, nothing written, in bounded time and memory.

The run is `core_config`'s (one token file of 40 instances of 16 tokens, 5 batches of 8 an epoch), here with a
manifest beside the token file that says uint16, as `olmo-data tokenize` writes one.
"""

from __future__ import annotations

import copy
import json
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.errors import DataError
from olmo_data.olmo_core import build_olmo_core_order, olmo_core_order, order_file_name
from tests.data.olmo_core.test_olmo_core_commands import L, core_config

COMMANDS = {
    "inspect-batch": ["--step", "1"],
    "trace": ["--tokens", "2,3,4"],
    "stats": [],
    "build-order": [],
}
SCHEDULER = "olmo_core.train.callbacks.batch_size_scheduler.BatchSizeSchedulerCallback"
Edit = Callable[[dict[str, Any], Path], None]


def order_path(tmp_path: Path, epoch: int = 1) -> Path:
    return tmp_path / "work" / order_file_name(40, epoch, 7)


def with_manifest(tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """core_config's run, its token file described by a manifest of ours (uint16, 640 tokens)."""
    path = core_config(tmp_path)
    manifest = {"format": "olmo-data.tokens", "version": 1, "dtype": "uint16"}
    manifest["files"] = [{"path": "a.npy", "tokens": 40 * L}]
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "work").mkdir()
    return path, json.loads(Path(path).read_text())


def write_order(tmp_path: Path, data: np.ndarray) -> None:
    order_path(tmp_path).write_bytes(data.tobytes())


def set_key(dotted: str, value: Any) -> Edit:
    def edit(config: dict[str, Any], tmp_path: Path) -> None:
        *parents, last = dotted.split(".")
        node = config
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value

    return edit


def schedule(sizes: list[Any], starts: list[Any]) -> Edit:
    cb = {"_CLASS_": SCHEDULER, "batch_sizes": sizes, "schedule": [{"value": v, "unit": "steps"} for v in starts]}
    return set_key("trainer.callbacks", {"batch_size": cb})


def order_of_dtype(dtype: str) -> Edit:
    """OLMo-core's order of epoch 1 written as another dtype, cut or padded to the right byte size (160 bytes)."""

    def edit(config: dict[str, Any], tmp_path: Path) -> None:
        entries = build_olmo_core_order(40, 7, 1).astype(dtype)
        write_order(tmp_path, np.resize(entries, 160 // entries.itemsize))

    return edit


def order_entry(position: int, value: int) -> Edit:
    def edit(config: dict[str, Any], tmp_path: Path) -> None:
        order = build_olmo_core_order(40, 7, 1).astype("<u4")
        order[position] = value
        write_order(tmp_path, order)

    return edit


def order_directory(config: dict[str, Any], tmp_path: Path) -> None:
    order_path(tmp_path).mkdir()


def huge_order(config: dict[str, Any], tmp_path: Path) -> None:
    """8 GiB under the order's name (sparse: no disk used), which must not be read to be refused."""
    with open(order_path(tmp_path), "wb") as f:
        f.truncate(8 << 30)


def vocab_of_uint32_without_manifest(config: dict[str, Any], tmp_path: Path) -> None:
    """A dolma-style token file (no manifest) of uint16 ids, the config's vocabulary implying uint32."""
    (tmp_path / "manifest.json").unlink()
    config["dataset"]["tokenizer"]["vocab_size"] = 100_278


def paths_name_the_directory(config: dict[str, Any], tmp_path: Path) -> None:
    config["dataset"]["paths"] = [str(tmp_path)]


def missing_label_mask(config: dict[str, Any], tmp_path: Path) -> None:
    config["dataset"]["label_mask_paths"] = [str(tmp_path / "mask.npy")]


# case: (edit, the fragments every command's line holds)
CASES: dict[str, tuple[Edit, list[str]]] = {
    "order-uint64": (order_of_dtype("<u8"), ["global_indices_", "entry 3 is instance 0 again", "epoch 1"]),
    "order-uint16": (order_of_dtype("<u2"), ["global_indices_", "entry 0 is instance", "past the dataset's 40"]),
    "order-float32": (order_of_dtype("<f4"), ["global_indices_", "past the dataset's 40"]),
    "order-entry-past-the-data": (order_entry(3, 1000), ["global_indices_", "entry 3 is instance 1,000"]),
    "order-is-a-directory": (order_directory, ["global_indices_", "a directory where OLMo-core's order of epoch 1"]),
    "order-of-8-gib": (huge_order, ["global_indices_", "8,589,934,592 bytes, but OLMo-core's order", "(160 bytes)"]),
    "vocab-implies-uint32": (
        set_key("dataset.tokenizer.vocab_size", 100_278),
        ["config.json: dataset.tokenizer.vocab_size 100278", "uint32", "manifest.json", "a.npy holds uint16"],
    ),
    "dtype-disagrees": (
        set_key("dataset.dtype", "uint32"),
        ["config.json: dataset.dtype uint32 disagrees with", "manifest.json", "uint16"],
    ),
    "vocab-implies-uint32-no-manifest": (
        vocab_of_uint32_without_manifest,
        ["a.npy: token 0 reads as id 196,610, past dataset.tokenizer.vocab_size 100,278", "as uint32"],
    ),
    "directory-in-paths": (paths_name_the_directory, ["dataset.paths names", "a directory"]),
    "label-mask-missing": (missing_label_mask, ["label mask", "mask.npy", "dataset.label_mask_paths"]),
    "string-sequence-length": (set_key("dataset.sequence_length", "16"), ["dataset.sequence_length is '16'"]),
    "string-duration": (set_key("trainer.max_duration.value", "two"), ["trainer.max_duration.value is 'two'"]),
    "duration-unit": (set_key("trainer.max_duration.unit", "days"), ["trainer.max_duration.unit is 'days'"]),
    "callbacks-a-list": (set_key("trainer.callbacks", [1, 2]), ["trainer.callbacks is [1, 2]"]),
    "trainer-a-string": (set_key("trainer", "fast"), ["trainer is 'fast'"]),
    "schedule-batch-of-0": (schedule([8 * L, 0], [0, 2]), ["batch_size.batch_sizes[1] is 0"]),
    "schedule-strings": (schedule(["x", 8 * L], [0, "a"]), ["batch_size.batch_sizes[0] is 'x'"]),
    "schedule-not-lists": (
        set_key("trainer.callbacks", {"b": {"_CLASS_": SCHEDULER, "batch_sizes": 5, "schedule": 3}}),
        ["trainer.callbacks.b: batch_sizes and schedule must be lists"],
    ),
    "huge-sequence-length": (set_key("dataset.sequence_length", 2**40), ["dataset.sequence_length is 1099511627776"]),
    "huge-batch": (set_key("data_loader.global_batch_size", 2**62), ["data_loader.global_batch_size is 46116"]),
    "negative-seed": (set_key("data_loader.seed", -5), ["data_loader.seed is -5"]),
    "huge-seed": (set_key("data_loader.seed", 2**200), ["data_loader.seed is 16069380442589902755"]),
    "huge-epochs": (
        set_key("trainer.max_duration", {"value": 10**15, "unit": "epochs"}),
        ["trainer.max_duration.value is 1000000000000000", "0 to 10,000"],
    ),
    "huge-tokens": (
        set_key("trainer.max_duration", {"value": 10**30, "unit": "tokens"}),
        ["trainer.max_duration.value is 1000000000000000000000000000000"],
    ),
    "huge-chunks": (
        set_key("dataset.max_target_sequence_length", 16 * 2**50),
        ["dataset.max_target_sequence_length is 18014398509481984"],
    ),
    "negative-pad": (set_key("dataset.tokenizer.pad_token_id", -1), ["dataset.tokenizer.pad_token_id is -1"]),
    "filter-of-0": (
        set_key("dataset.instance_filter_config", {"repetition_max_count": 0}),
        ["dataset.instance_filter_config.repetition_max_count is 0"],
    ),
    "paths-not-strings": (set_key("dataset.paths", [{"a": 1}]), ["dataset.paths is [{'a': 1}]"]),
}


def one_line(out: Any, fragments: list[str]) -> str:
    """Exit 2, one line of output (click's runner mixes stderr in), no traceback, each fragment in it."""
    text = out.output
    assert out.exit_code == 2 and "Traceback" not in text, text
    assert text.count("\n") == 1 and text.startswith("error: "), text
    for fragment in fragments:
        assert fragment in text, (fragment, text)
    return text


def listing(tmp_path: Path) -> list[tuple[str, int]]:
    return sorted((str(p), p.stat().st_size if p.is_file() else -1) for p in tmp_path.rglob("*"))


@pytest.mark.parametrize("case", list(CASES))
def test_each_fault_is_one_line_in_every_command(case: str, tmp_path: Path) -> None:
    edit, fragments = CASES[case]
    path, config = with_manifest(tmp_path)
    edit(config, tmp_path)
    Path(path).write_text(json.dumps(config))
    before = listing(tmp_path)
    for command, args in COMMANDS.items():
        t0 = time.perf_counter()
        out = CliRunner().invoke(data_main, [command, path, *args])
        one_line(out, fragments)
        assert time.perf_counter() - t0 < 20, (command, case)
        assert listing(tmp_path) == before, command  # nothing written, nothing partial left
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 2 << 20  # KiB: the process never held 2 GB


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        (lambda good: good[:200], ["config.json: not valid JSON: ", "(line 1, column "]),
        (lambda good: '{"dataset": ' + "[" * 100_000 + "]" * 100_000 + "}", ["config.json: nested too deeply"]),
    ],
    ids=["truncated", "deeply-nested"],
)
def test_an_unreadable_config_json_is_one_line_in_every_command(
    tmp_path: Path, text: Callable[[str], str], fragments: list[str]
) -> None:
    path, _ = with_manifest(tmp_path)
    Path(path).write_text(text(Path(path).read_text()))
    for command, args in [*COMMANDS.items(), ("spikes", [])]:
        one_line(CliRunner().invoke(data_main, [command, path, *args]), fragments)


def test_trace_of_a_run_too_long_to_walk_is_one_line(tmp_path: Path) -> None:
    """10**15 steps of 5 an epoch: the other commands answer (one epoch's order each), trace refuses to walk
    2 * 10**14 epochs, naming the span, rather than run for ever."""
    path, config = with_manifest(tmp_path)
    set_key("trainer.max_duration", {"value": 10**15, "unit": "steps"})(config, tmp_path)
    Path(path).write_text(json.dumps(config))
    out = CliRunner().invoke(data_main, ["trace", path, "--tokens", "2,3,4"])
    one_line(out, ["steps 1..1,000,000,000,000,000 span epochs 1..200,000,000,000,000", "at most 10,000 epochs"])
    out = CliRunner().invoke(data_main, ["trace", path, "--tokens", "2,3,4", "--steps", "1..10"])
    assert out.exit_code == 0 and "traced through steps 1..10 " in out.output, out.output
    out = CliRunner().invoke(data_main, ["inspect-batch", path, "--step", str(10**14), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["epoch"] == 2 * 10**13, out.output


def test_an_order_damaged_past_the_sampled_blocks_is_refused_when_read_whole(tmp_path: Path) -> None:
    """A large order file with one entry written twice between the blocks checked at opening: the slices around it
    read as they are (each entry is an instance of the data), the whole order, as trace reads it, is refused."""
    n = 200_000
    order = build_olmo_core_order(n, 7, 1).astype("<u4")
    order[100_500] = order[100_501]
    (tmp_path / order_file_name(n, 1, 7)).write_bytes(order.tobytes())
    found = olmo_core_order(str(tmp_path), n, 7, 1)
    assert found.path is not None and len(found.entries(0, 8)) == 8
    with pytest.raises(DataError, match=r"_v1\.npy: instance [\d,]+ is not in it \(another entry holds an instance"):
        found.whole()


def test_positions_of_searches_by_blocks_and_checks_a_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """trace's search of a file's order, a block at a time: the positions and entries a search of the whole order
    finds; a damaged file refused as `whole` refuses it; a file found sound is not checked again (its verdict kept
    by path, size and mtime) until it is rewritten, when its damage is found again."""
    import olmo_data.dataset.order_checks as order_checks

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(order_checks, "SCAN_ENTRIES", 4_096)  # many blocks
    n = 200_000
    good = build_olmo_core_order(n, 7, 1).astype("<u4")
    path = tmp_path / order_file_name(n, 1, 7)
    path.write_bytes(good.tobytes())
    wanted = np.array([3, 4_097, 199_999, 12], dtype=np.int64)
    positions, entries = olmo_core_order(str(tmp_path), n, 7, 1).positions_of(wanted)
    want = np.flatnonzero(np.isin(good, wanted))
    assert positions.tolist() == want.tolist() and entries.tolist() == good[want].tolist() and len(want) == 4
    verdicts = list((tmp_path / "cache" / "order-checks").iterdir())
    assert len(verdicts) == 1
    zeros = np.zeros

    def no_bitmap(shape: Any, *args: Any, **kwargs: Any) -> np.ndarray:
        assert shape != n, "checked again"  # (the check's bitmap: a byte per instance)
        return zeros(shape, *args, **kwargs)

    monkeypatch.setattr(np, "zeros", no_bitmap)
    assert olmo_core_order(str(tmp_path), n, 7, 1).positions_of(wanted)[0].tolist() == want.tolist()
    monkeypatch.undo()
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    damaged = good.copy()
    damaged[100_500] = damaged[100_501]  # (between the blocks sampled at opening)
    time.sleep(0.01)
    path.write_bytes(damaged.tobytes())  # rewritten: another mtime, so checked again
    with pytest.raises(DataError, match=r"_v1\.npy: instance [\d,]+ is not in it \(another entry holds an instance"):
        olmo_core_order(str(tmp_path), n, 7, 1).positions_of(wanted)


def test_a_damaged_padded_instance_file_is_refused_naming_it(tmp_path: Path) -> None:
    """OLMo-core's stored boundaries of a padded dataset's instances, past the token file's end, are named as
    themselves: not a token file that 'shrank'."""
    from olmo_data.olmo_core.dataset import instance_indices_path

    path, config = with_manifest(tmp_path)
    config["dataset"]["_CLASS_"] = "olmo_core.data.numpy_dataset.NumpyPaddedFSLDatasetConfig"
    Path(path).write_text(json.dumps(config))
    token_file = str(tmp_path / "a.npy")
    stored = Path(instance_indices_path(str(tmp_path / "work"), L, token_file, 40 * L * 2))
    stored.parent.mkdir(parents=True)
    stored.write_bytes(np.array([0, 16, 16, 32, 5000, 5010], dtype="<u4").tobytes())
    for command, args in COMMANDS.items():
        out = CliRunner().invoke(data_main, [command, path, *args])
        one_line(out, [str(stored), "instance 2 is tokens [5000, 5010]", "of the 640 tokens of"])
    stored.write_bytes(b"\0" * 7)
    one_line(CliRunner().invoke(data_main, ["stats", path]), [str(stored), "7 bytes is not OLMo-core's"])


# ---- import-olmo-core ----------------------------------------------------------------------------------------


def _distcp(step: Path, how: str) -> None:
    for shard in (step / "model_and_optim").glob("*.distcp"):
        shard.write_bytes(b"\0" * shard.stat().st_size if how == "zeroed" else shard.read_bytes()[:100])


IMPORT_CASES: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "deeply-nested": (
        lambda step: (step / "config.json").write_text('{"model": ' + "[" * 100_000 + "]" * 100_000 + "}"),
        ["config.json: JSON nested too deeply"],
    ),
    "truncated": (
        lambda step: (step / "config.json").write_text((step / "config.json").read_text()[:300]),
        ["config.json: not valid JSON: ", "(line 1, column 301"],
    ),
    "string-lr": (
        lambda step: _edit_json(step, lambda c: c["train_module"]["optim"].update(lr="fast")),
        ["config.json: train_module.optim.lr must be a finite non-negative number, got 'fast'"],
    ),
    "100000-layers": (
        lambda step: _edit_json(step, lambda c: c["model"].update(n_layers=100_000)),
        ["config.json: model.n_layers is 100000, but ", "model_and_optim holds 2 blocks"],
    ),
    "huge-width": (
        lambda step: _edit_json(step, lambda c: c["model"].update(d_model=2**40)),
        ["config.json: model.vocab_size 256 and d_model 1099511627776", "embeddings of shape [256, 32]"],
    ),
    "truncated-shard": (lambda step: _distcp(step, "cut"), ["__0_0.distcp is truncated (100 bytes"]),
    "zeroed-shard": (lambda step: _distcp(step, "zeroed"), ["__0_0.distcp: not readable as a checkpoint shard"]),
}


def _edit_json(step: Path, edit: Callable[[dict[str, Any]], Any]) -> None:
    config = json.loads((step / "config.json").read_text())
    edit(config)
    (step / "config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def core_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("olmo_core", reason="ai2-olmo-core builds the reference checkpoint (the olmo-core extra)")
    from tests.convert.test_import_olmo_core import save_core_checkpoint

    return save_core_checkpoint(tmp_path_factory.mktemp("core"), "olmo2")[0]


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_import_olmo_core_faults_are_one_line(case: str, core_checkpoint: Path, tmp_path: Path) -> None:
    from olmo_cli.train_main import main as train_main

    edit, fragments = IMPORT_CASES[case]
    step = tmp_path / core_checkpoint.name
    shutil.copytree(core_checkpoint, step)
    edit(step)
    t0 = time.perf_counter()
    out = CliRunner().invoke(train_main, ["import-olmo-core", str(step), "--destination", str(tmp_path / "o")])
    lines = [line for line in out.output.splitlines() if line.strip()]
    assert out.exit_code == 2 and "Traceback" not in out.output and len(lines) == 1, out.output
    assert lines[0].startswith("error: ") and all(f in lines[0] for f in fragments), (fragments, lines)
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "o").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp")]


def test_the_matrix_configs_are_otherwise_good(tmp_path: Path) -> None:
    """The run every case breaks answers in every command: each refusal above is the edit's, not the fixture's."""
    path, config = with_manifest(tmp_path)
    for command, args in COMMANDS.items():
        out = CliRunner().invoke(data_main, [command, path, *args])
        assert out.exit_code == 0, (command, out.output)
    assert copy.deepcopy(config) == json.loads(Path(path).read_text())


# ---- the orders of a run of ours (global_indices.npy and its side file) -----------------------------------------


def our_run(tmp_path: Path) -> tuple[str, Path]:
    """A config of ours over 40 instances of 16 tokens, its epoch-0 order built by build-order."""
    import yaml

    tokens = tmp_path / "a.npy"
    (np.arange(40 * L, dtype=np.uint16) % 97 + 2).tofile(tokens)
    config = {"data": {"paths": [str(tokens)]}, "model": {"max_sequence_length": L}, "seed": 1}
    config |= {"global_train_batch_size": 8, "max_duration": "1ep", "save_folder": str(tmp_path / "save")}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    out = CliRunner().invoke(data_main, ["build-order", str(tmp_path / "config.yaml")])
    assert out.exit_code == 0, out.output
    return str(tmp_path / "config.yaml"), tmp_path / "save" / "train_data" / "global_indices.npy"


@pytest.mark.parametrize(
    ("position", "value", "said"),
    [(3, 1000, "entry 3 is instance 1,000, past the data's 40 instances"), (3, None, "is instance")],
    ids=["past-the-data", "an-entry-twice"],
)
def test_a_damaged_order_of_ours_is_one_line_in_every_command(
    tmp_path: Path, position: int, value: int | None, said: str
) -> None:
    """Same size, same side file, one entry changed: inspect-batch and trace name the order file and the entry
    (not the data as 'out of range', nor a silent answer), and build-order no longer calls it 'checked'."""
    config, order = our_run(tmp_path)
    entries = np.fromfile(order, dtype="<u4")
    entries[position] = value if value is not None else entries[position + 1]
    entries.tofile(order)
    for command, args in [("inspect-batch", ["--step", "1"]), ("trace", ["--tokens", "2,3,4"]), ("build-order", [])]:
        out = CliRunner().invoke(data_main, [command, config, *args])
        one_line(out, [f"{order}: entry ", said if command != "build-order" else "the order built for this data"])


def test_a_schedule_replayed_past_the_epoch_bound_is_one_line(tmp_path: Path) -> None:
    """With a batch-size schedule the run is replayed step by step: a max_duration of 10**17 tokens over 40
    instances (10**13 epochs) is refused naming the callback and the duration; 10,000 epochs, the bound, answer."""
    path, config = with_manifest(tmp_path)
    schedule([4 * L, 8 * L], [0, 4])(config, tmp_path)
    set_key("trainer.max_duration", {"value": 10**17, "unit": "tokens"})(config, tmp_path)
    Path(path).write_text(json.dumps(config))
    for command in ("inspect-batch", "trace", "stats"):
        out = CliRunner().invoke(data_main, [command, path, *COMMANDS[command]])
        one_line(out, ["trainer.callbacks' batch-size schedule is replayed over at most 10,000 epochs", "tokens)"])
    set_key("trainer.max_duration", {"value": 10_000, "unit": "epochs"})(config, tmp_path)
    Path(path).write_text(json.dumps(config))
    out = CliRunner().invoke(data_main, ["stats", path, "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["steps"] > 10_000 * 5, out.output


def test_a_large_rebuilt_order_is_kept_in_the_cache_and_mapped_by_later_commands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An order rebuilt because its file is absent is kept under OLMo-core's name in the cache (above the size at
    which keeping pays), mapped by the next call instead of shuffled again, and a damaged kept copy is rebuilt
    over, not trusted."""
    from olmo_data.olmo_core import order as order_module

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(order_module, "KEEP_REBUILT_FROM", 1000)
    n, want = 5000, build_olmo_core_order(5000, 7, 2)
    first = olmo_core_order(str(tmp_path / "absent"), n, 7, 2)
    kept = tmp_path / "cache" / "olmo-core-orders" / order_file_name(n, 2, 7)
    assert "kept in" in first.note and kept.read_bytes() == want.astype("<u4").tobytes()
    again = olmo_core_order(str(tmp_path / "absent"), n, 7, 2)
    assert isinstance(again.order, np.memmap) and np.array_equal(again.whole(), want)
    kept.write_bytes(bytes(4 * n))  # zeroed: every sampled entry is instance 0
    damaged = olmo_core_order(str(tmp_path / "absent"), n, 7, 2)
    assert not isinstance(damaged.order, np.memmap) and np.array_equal(damaged.whole(), want)
    assert kept.read_bytes() == want.astype("<u4").tobytes()
    small = olmo_core_order(str(tmp_path / "absent"), 999, 7, 2)  # below the size: rebuilt, not kept
    assert "kept" not in small.note and not (kept.parent / order_file_name(999, 2, 7)).exists()
