"""OLMo 3's data recipes at small scale, against OLMo-core 3.0.0 itself.

Where the settings come from: allenai/OLMo-core, src/scripts/official/OLMo3/ (read at commit fa6c5014; their data
settings are unchanged since each script was added, in 600d2fe2, bdc61e4a, 6b73ba05, a25a5144, 14b15cc2 and
20548a05, but for renamed mixes). Every script builds its dataset with `<DatasetConfig>.from_data_mix(mix,
mix_base_dir=..., work_dir=..., tokenizer=TokenizerConfig.dolma2(), ...)` (dolma2: vocab 100,278, EOS 100,257,
pad 100,277, no BOS; uint32 token files) and its loader with `NumpyDataLoaderConfig(global_batch_size, seed,
num_workers)` (no loader work_dir: the dataset's is used):

===================  =============================================  ===================================================
recipe               script (OLMo-3-1025-*.py)                      data settings
===================  =============================================  ===================================================
7B pretraining       7B-pretrain-1, 7B-pretrain-2 (its resumption)  NumpyFSLDatasetConfig, OLMo-mix-0625-official,
                                                                    sequence_length 8192, max_target_sequence_length
                                                                    max(8192, sequence_length); batch 8192 x 512
                                                                    tokens, seed 34521, 8 workers; max_duration 5e12
                                                                    tokens, hard_stop step 597,046 (part 2: 7e12
                                                                    tokens, hard_stop 1 epoch)
7B mid-training      7B-midtrain                                    NumpyFSLDatasetConfig, OLMo-midtraining-mix-0625-
                                                                    100B, 8192 (max target the same); batch 2**21
                                                                    tokens (256 instances), seed 1337, 4 workers;
                                                                    max_duration 1e11 tokens
7B long context      7B-long-context                                NumpyPackedFSLDatasetConfig, OLMo-longmino-mix-
                                                                    0625, 65,536, generate_doc_lengths true,
                                                                    source_group_size 8, source_permutation_seed 123,
                                                                    long_doc_strategy left at OLMo-core's default
                                                                    (truncate); batch 65,536 x 64, seed 34521, 4
                                                                    workers; max_duration 5e12 tokens, hard_stop step
                                                                    597,046 (as the pretraining script)
32B pretraining      32B-pretrain                                   NumpyFSLDatasetConfig, OLMo-mix-0925-official,
                                                                    8192 (max target the same), InstanceFilterConfig(
                                                                    repetition_max_period=13, min_period=1,
                                                                    max_count=32); batch 8 x 1024 x 1024 tokens (1024
                                                                    instances), seed 34521, 8 workers; 1 epoch
32B mid-training     32B-midtrain-ingredient-1 and -2 (same but     NumpyFSLDatasetConfig, OLMo-midtraining-mix-0925-
                     for the mix)                                   ingredient1-100B (ingredient2-100B), 8192 (max
                                                                    target the same), the instance filter as above;
                                                                    batch 4 x 1024 x 1024 tokens (512 instances), seed
                                                                    42069, 4 workers; max_duration 1e11 tokens
32B long context     32B-long-context                               NumpyPackedFSLDatasetConfig, OLMo-longmino-mix-
                                                                    0925, 65,536, generate_doc_lengths, source_group_
                                                                    size 8, source_permutation_seed 123, the instance
                                                                    filter as above; batch 8 x 1024 x 1024 tokens (128
                                                                    instances), seed 34521, 8 workers; 1e11 tokens
===================  =============================================  ===================================================

No script uses a source mixture (SourceMixtureDatasetConfig) or a batch-size schedule: each mix is a list of
token files. At small scale each recipe keeps its classes and every option, with sequence lengths / 128 (64 and
512), batches of instances / 32, and the mix replaced by `paths` (a dozen seeded dolma2-like uint32 files with
tokenize-style .csv.gz metadata; the long-context ones with documents longer than an instance and a tail after
the last EOS; the filtered ones with planted repetitions the filter catches). OLMo-core's config classes write
config.json; its dataset and NumpyDataLoader, driven as its Trainer drives them (tests/olmo_core_reference.py), give
the reference on 2 ranks over epochs 1 to 3; `read_run(config.json)` must give every step's instance numbers,
tokens, label masks, doc_lens, instance masks and fingerprints, and the commands (inspect-batch, trace --document,
stats, build-order) must agree with OLMo-core. The scripts' configs as they are saved name their mix
(`dataset.mix`), which this project refuses in one line (a mix is OLMo-core's own file list): tested too.
The small runs' max_duration reaches the last step driven and their hard_stop (7B's) is about halfway, as the
script's; the run length the commands report comes from max_duration alone (trainer.hard_stop, where OLMo-core's
Trainer stops too, is not read yet), so it is not asserted here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from olmo_data.dataset.fingerprint import batch_fingerprint
from olmo_data.errors import DataError
from olmo_data.run import read_run
from tests.data.olmo_core.checks import inspected_rows, write_metadata

WORLD = 2
EOS, PAD, VOCAB = 100257, 100277, 100278  # dolma2's, as TokenizerConfig.dolma2() gives them (checked below)
SEQ_SCALE, BATCH_SCALE = 128, 32


@dataclass(frozen=True)
class Recipe:
    """One OLMo 3 stage's data settings, at OLMo 3's scale (see the module docstring for their sources)."""

    name: str
    mix: str
    packed: bool
    sequence_length: int
    batch_instances: int
    seed: int
    num_workers: int
    filtered: bool  # InstanceFilterConfig(13, 1, 32)
    max_duration: tuple[str, int]  # the Duration's unit and value
    hard_stop: tuple[str, int] | None = None


RECIPES = [
    Recipe(
        "7B-pretrain",
        "OLMo-mix-0625-official",
        False,
        8192,
        512,
        34521,
        8,
        False,
        ("tokens", int(5e12)),
        ("steps", 597046),
    ),  # fmt: skip
    Recipe("7B-midtrain", "OLMo-midtraining-mix-0625-100B", False, 8192, 256, 1337, 4, False, ("tokens", int(1e11))),
    Recipe(
        "7B-long-context",
        "OLMo-longmino-mix-0625",
        True,
        65536,
        64,
        34521,
        4,
        False,
        ("tokens", int(5e12)),
        ("steps", 597046),
    ),  # fmt: skip
    Recipe("32B-pretrain", "OLMo-mix-0925-official", False, 8192, 1024, 34521, 8, True, ("epochs", 1)),
    Recipe(
        "32B-midtrain",
        "OLMo-midtraining-mix-0925-ingredient1-100B",
        False,
        8192,
        512,
        42069,
        4,
        True,
        ("tokens", int(1e11)),
    ),  # fmt: skip
    Recipe("32B-long-context", "OLMo-longmino-mix-0925", True, 65536, 128, 34521, 8, True, ("tokens", int(1e11))),
]
OTHER_MIXES = {
    "7B-pretrain-2": "OLMo-mix-0625-official",
    "32B-midtrain-2": "OLMo-midtraining-mix-0925-ingredient2-100B",
}


def recipe_config(
    recipe: Recipe,
    save: Path,
    *,
    paths: list[str] | None,
    scale: bool,
    duration: tuple[str, int] | None = None,
    hard_stop: tuple[str, int] | None = None,
) -> Any:
    """The recipe's ExperimentConfig, through OLMo-core's own classes: at OLMo 3's sizes from its mix, or `scale`d
    down over `paths` (with `duration` and `hard_stop` in that run's terms). The model is a tiny stand-in (it
    plays no part in the data)."""
    from olmo_core.data import (
        DataMix,
        NumpyDataLoaderConfig,
        NumpyFSLDatasetConfig,
        NumpyPackedFSLDatasetConfig,
        TokenizerConfig,
    )
    from olmo_core.data.numpy_dataset import InstanceFilterConfig
    from olmo_core.nn.transformer import TransformerConfig
    from olmo_core.optim import AdamWConfig
    from olmo_core.script_utils import ExperimentConfig
    from olmo_core.train import Duration, TrainerConfig
    from olmo_core.train.train_module import TransformerTrainModuleConfig

    tokenizer = TokenizerConfig.dolma2()
    length = recipe.sequence_length // (SEQ_SCALE if scale else 1)
    options: dict[str, Any] = {"tokenizer": tokenizer, "work_dir": str(save.parent / "work"), "sequence_length": length}
    if recipe.filtered:
        options["instance_filter_config"] = InstanceFilterConfig(
            repetition_max_period=13, repetition_min_period=1, repetition_max_count=32
        )
    cls: Any = NumpyPackedFSLDatasetConfig
    if recipe.packed:
        options |= {"generate_doc_lengths": True, "source_group_size": 8, "source_permutation_seed": 123}
    else:
        cls = NumpyFSLDatasetConfig  # the scripts' max(8192, sequence_length), scaled
        options["max_target_sequence_length"] = max(8192 // (SEQ_SCALE if scale else 1), length)
    if paths is None:
        dataset = cls.from_data_mix(DataMix(recipe.mix), mix_base_dir=str(save.parent / "data"), **options)
    else:
        dataset = cls(paths=paths, **options)
    instances = recipe.batch_instances // (BATCH_SCALE if scale else 1)
    unit, value = duration or recipe.max_duration
    stop_unit, stop_value = hard_stop or recipe.hard_stop or (None, 0)
    stop = None if stop_unit is None else getattr(Duration, stop_unit)(stop_value)
    return ExperimentConfig(
        model=TransformerConfig.llama_like(d_model=32, vocab_size=tokenizer.padded_vocab_size(), n_layers=1, n_heads=2),
        dataset=dataset,
        data_loader=NumpyDataLoaderConfig(
            global_batch_size=instances * length, seed=recipe.seed, num_workers=recipe.num_workers
        ),
        train_module=TransformerTrainModuleConfig(
            rank_microbatch_size=length, max_sequence_length=length, optim=AdamWConfig(lr=1e-3)
        ),
        trainer=TrainerConfig(
            save_folder=str(save), max_duration=getattr(Duration, unit)(value), hard_stop=stop, save_overwrite=True
        ),
    )


def token_files(folder: Path, recipe: Recipe, seed: int) -> list[str]:
    """A dozen seeded dolma2-like uint32 token files (ids below dolma2's special tokens, each document ended by
    EOS) with tokenize-style .csv.gz metadata; packed recipes get documents past an instance's length (the
    longmino data's) and a tail after the last EOS (no document: OLMo-core's packer drops it); filtered ones get
    periodic runs (periods 1-3, 28-40 copies: some the instance filter catches)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    length = recipe.sequence_length // SEQ_SCALE
    per_file = length * recipe.batch_instances // BATCH_SCALE // 2  # about 6 batches an epoch in 12 files
    out = []
    for f in range(12):
        docs: list[np.ndarray] = []
        while sum(len(d) for d in docs) < per_file:
            n = int(min(rng.lognormal(5, 1), 3 * length)) + 1 if recipe.packed else int(rng.integers(1, 300))
            body = rng.integers(0, EOS, size=n).astype(np.uint32)
            if recipe.filtered and n > 40 and rng.random() < 0.4:
                period, copies = int(rng.integers(1, 4)), int(rng.integers(28, 41))
                run = np.tile(body[:period], copies)[: n - 1]
                at = int(rng.integers(0, n - len(run) + 1))
                body[at : at + len(run)] = run
            docs.append(np.append(body, np.uint32(EOS)))
        tail = [rng.integers(0, EOS, size=int(rng.integers(1, 20))).astype(np.uint32)] if recipe.packed else []
        out.append(str(folder / f"part-{f:02d}-00000.npy"))
        np.concatenate(docs + tail).tofile(out[-1])
        write_metadata(out[-1], [len(d) for d in docs], f"{recipe.name}-{f}", f"src-{f}.jsonl")
    return out


def built_length(config: Any) -> int:
    """Instances in OLMo-core's dataset (packing first where the recipe packs)."""
    dataset = config.dataset.build()
    dataset.prepare()
    return len(dataset)


def drive(core: Any, tmp_path: Path, recipe: Recipe, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any, Any]:
    """The small recipe's config.json, its OLMo-core config and OLMo-core's batches on WORLD ranks into epoch 3
    (driven without loader workers: OLMo-core hands each worker whole batches in turn, so the order is the same)."""
    paths = token_files(tmp_path / "data", recipe, seed=len(recipe.name))
    config = recipe_config(recipe, tmp_path / "save", paths=paths, scale=True)
    per_batch = recipe.batch_instances // BATCH_SCALE
    last = 2 * (built_length(config) // per_batch) + 2
    # the recipe's Duration units, in this run's terms: max_duration to the last step driven, a hard_stop about
    # halfway (as 597,046 of 5e12 tokens' 1,192,093 steps; the 7B's part 2 trains the later steps, same data)
    unit = recipe.max_duration[0]
    value = {"tokens": last * per_batch * config.dataset.sequence_length, "epochs": 3}.get(unit, last)
    stop = ("steps", last // 2) if recipe.hard_stop else None
    config = recipe_config(recipe, tmp_path / "save", paths=paths, scale=True, duration=(unit, value), hard_stop=stop)
    config_json = core.save_config_json(config, tmp_path / "save" / "step0")
    plain = dataclasses.replace(config, data_loader=dataclasses.replace(config.data_loader, num_workers=0))
    reference = core.drive_loader(plain, world_size=WORLD, last_step=last, monkeypatch=monkeypatch)
    assert reference[0][-1].epoch == 3 and len(reference[0]) == last
    return config_json, config, reference


def compare(run: Any, reference: dict[int, list[Any]], core: Any, recipe: Recipe) -> None:
    """Every step's global batch as read_run reads the config.json: OLMo-core's, row for row."""
    for step in range(1, len(reference[0]) + 1):
        ours = run.batch(step)
        want = core.global_rows(reference, step, "input_ids")
        assert ours.epoch == reference[0][step - 1].epoch
        np.testing.assert_array_equal(ours.instances, core.global_rows(reference, step, "index"), err_msg=str(step))
        np.testing.assert_array_equal(ours.tokens, want, err_msg=str(step))
        assert ours.fingerprint == batch_fingerprint(want)
        if reference[0][step - 1].label_mask is None:
            assert ours.label_mask is None
        else:
            np.testing.assert_array_equal(ours.label_mask, core.global_rows(reference, step, "label_mask"))
        filtered = run.instance_filter(ours.instances, ours.tokens)
        if recipe.filtered:
            np.testing.assert_array_equal(~filtered.masked, core.global_rows(reference, step, "instance_mask"))
        else:
            assert filtered is None and reference[0][step - 1].instance_mask is None
        if recipe.packed:
            theirs = [row for r in range(WORLD) for row in reference[r][step - 1].doc_lens]
            order = [r + WORLD * i for r in range(WORLD) for i in range(len(reference[r][step - 1].index))]
            mine = [ours.doc_lens[p].tolist() for p in order]
            assert mine == [d.tolist() for d in theirs], step
        else:
            assert ours.doc_lens is None


@pytest.mark.parametrize("recipe", RECIPES, ids=[r.name for r in RECIPES])
def test_olmo3_recipe_at_small_scale(
    core: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recipe: Recipe
) -> None:
    config_json, config, reference = drive(core, tmp_path, recipe, monkeypatch)
    tokenizer = json.loads(Path(config_json).read_text())["dataset"]["tokenizer"]
    assert (tokenizer["eos_token_id"], tokenizer["pad_token_id"], tokenizer["vocab_size"]) == (EOS, PAD, VOCAB)
    assert tokenizer.get("bos_token_id") is None
    run = read_run(config_json)
    compare(run, reference, core, recipe)
    ids = np.concatenate([s.input_ids for s in reference[0]])
    if recipe.filtered:  # the planted repetitions are caught, and not everything is
        keep = np.concatenate([s.instance_mask for s in reference[0]])
        assert 0 < keep.sum() < len(keep)
    if recipe.packed:
        assert (ids[:, -1] == PAD).any()  # padded instances
        check_packed_commands(config_json, config, reference)
        rebuilt = read_run(config_json, order=str(tmp_path / "elsewhere"))  # without OLMo-core's files
        for step in range(1, len(reference[0]) + 1):
            assert rebuilt.batch(step).fingerprint == run.batch(step).fingerprint
    else:
        from tests.olmo_core_commands import check_commands

        check_commands(config_json, config, reference)


def test_olmo3_scripts_configs_name_a_mix_refused_in_one_line(core: Any, tmp_path: Path) -> None:
    """Each script's config as it is saved (OLMo 3's sizes, `from_data_mix`): refused by key, in one line."""
    mixes = {r.name: (r, r.mix) for r in RECIPES}
    mixes |= {name: (next(r for r in RECIPES if name.startswith(r.name)), mix) for name, mix in OTHER_MIXES.items()}
    for name, (recipe, mix) in mixes.items():
        config = recipe_config(dataclasses.replace(recipe, mix=mix), tmp_path / name / "save", paths=None, scale=False)
        config_json = core.save_config_json(config, tmp_path / name / "save" / "step0")
        raw = json.loads(Path(config_json).read_text())["dataset"]
        assert raw["mix"] == mix and raw["sequence_length"] == recipe.sequence_length
        with pytest.raises(DataError) as e:
            read_run(config_json)
        message = str(e.value)
        assert "\n" not in message and f"dataset.mix is OLMo-core's named data mix '{mix}'" in message, name
        assert "dataset.paths" in message


# -- the commands on a packed recipe, against OLMo-core's own packing files ----------------------------------------


def core_pieces(dataset: Any, index: int) -> list[tuple[str, int, int]]:
    """(path, start, end) of each document piece OLMo-core packed into instance `index`, from its packing files."""
    g = next(g for g, (lo, hi) in enumerate(dataset.source_instance_offsets) if lo <= index < hi)
    paths = tuple(str(p) for p in dataset._source_path_groups[g])
    docs, offsets, flat = _packing(dataset, paths)
    starts = np.cumsum([0, *dataset.source_size_groups[g]])
    out = []
    a, b = offsets[index - dataset.source_instance_offsets[g][0]]
    for d in flat[a:b]:
        s, e = docs[d]
        k = int(np.searchsorted(starts, s, side="right")) - 1
        out.append((paths[k], int(s - starts[k]), int(e - starts[k])))
    return out


_PACKING: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _packing(dataset: Any, paths: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A source group's packing files as OLMo-core wrote them: documents, instance offsets, docs by instance."""
    if paths not in _PACKING:
        names = (
            dataset._get_document_indices_path,
            dataset._get_instance_offsets_path,
            dataset._get_docs_by_instance_path,
        )
        docs, offsets, flat = (np.fromfile(f(*paths), dtype=np.uint64).astype(np.int64) for f in names)
        _PACKING[paths] = (docs.reshape(-1, 2), offsets.reshape(-1, 2), flat)
    return _PACKING[paths]


def merged(pieces: list[Any]) -> list[tuple[str, int, int]]:
    """Pieces with each run of adjacent ones in one file joined."""
    out: list[tuple[str, int, int]] = []
    for p, s, e in pieces:
        if out and out[-1][0] == p and out[-1][2] == s:
            out[-1] = (p, out[-1][1], e)
        else:
            out.append((p, s, e))
    return out


def check_packed_commands(config_json: str, config: Any, reference: dict[int, list[Any]]) -> None:
    """inspect-batch (each rank, steps in epochs 1, 2 and 3): ids, tokens, masks, doc_lens and each instance's
    pieces of the files as OLMo-core's packing files give them; trace --document: the (step, rank) pairs whose
    batches held one of its tokens; stats: OLMo-core's sizes; build-order: its order and packing files' bytes."""
    from tests.olmo_core_commands import chosen_steps, metadata_rows, run_json

    dataset = config.dataset.build()
    dataset.work_dir = Path(config.dataset.work_dir)
    dataset.prepare()
    for theirs, row, inst in inspected_rows(config_json, reference, chosen_steps(reference)):
        np.testing.assert_array_equal(inst["label_mask"], theirs.label_mask[row])
        assert inst["doc_lens"] == theirs.doc_lens[row].tolist()
        if theirs.instance_mask is not None:
            assert inst["masked"] == (not theirs.instance_mask[row])
        assert merged(inst["pieces"]) == merged(core_pieces(dataset, int(theirs.index[row])))
    # trace: a document of the last step's first instance, held wherever OLMo-core packed a piece of it
    last = reference[0][-1]
    path, start, _ = core_pieces(dataset, int(last.index[0]))[0]
    a, b, doc_id = next(r for r in metadata_rows(path) if r[0] <= start < r[1])
    holding = {
        i for i in range(len(dataset)) if any(p == path and s < b and e > a for p, s, e in core_pieces(dataset, i))
    }
    want = sorted({(s.step, r) for r, steps in reference.items() for s in steps if holding & set(s.index.tolist())})
    got = run_json(
        ["trace", config_json, "--document", doc_id, "--steps", f"1..{last.step}", "--world-size", "2", "--json"]
    )
    assert sorted({(h["step"], h["rank"]) for h in got["hits"]}) == want and want
    assert {h["instance"] for h in got["hits"]} == holding
    per_batch = len(reference[0][0].index) * WORLD
    stats = run_json(["stats", config_json, "--json"])
    assert stats["trainer"] == "olmo-core" and stats["num_instances"] == len(dataset)
    assert stats["batches_per_epoch"] == len(dataset) // per_batch == sum(1 for s in reference[0] if s.epoch == 1)
    check_build_order(config_json, Path(config.dataset.work_dir))


def check_build_order(config_json: str, work_dir: Path) -> None:
    """build-order elsewhere writes OLMo-core's files (the epochs' orders, the packing files) byte for byte; in
    the run's own work_dir it finds them identical and keeps them."""
    from click.testing import CliRunner

    from olmo_cli.main import main as data_main

    def files(root: Path) -> dict[str, bytes]:
        return {
            str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and (p.name.startswith("global_indices") or p.parent.name == "dataset-common")
        }

    theirs = files(work_dir)
    other = work_dir.parent / "built"
    runner = CliRunner()
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3", "--destination", str(other)])
    assert result.exit_code == 0, result.output
    ours = files(other)
    assert sum(name.startswith("global_indices") for name in theirs) == 3
    assert {k: v for k, v in ours.items() if k in theirs} == theirs and set(ours) >= set(theirs), sorted(ours)
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("(kept)") == len(theirs), result.output
    assert os.listdir(work_dir / "dataset-common")
