"""OLMo's own published training configs (OLMo-7B.yaml, OLMo-1B.yaml: `published/`, every line as AI2 published it
but the data paths, swapped here for local token files) read by every data command, whatever their model and
optimizer sections hold (`init_fn: mitchell`, a save folder chosen by `${path.choose:...}`); the trainer still
refuses what it cannot train, naming the key (issue 41).

The batches are checked against OLMo's published rule, computed here without olmo_data: instance i is tokens
[i*L, (i+1)*L) of the token files laid end to end, each file cut to whole instances; epoch e's order is
`np.random.Generator(np.random.PCG64(seed + e)).permutation(instances)`; step N trains batch N-1.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from olmo_cli.main import main as data_main
from olmo_data.config import ConfigError, load_config, read_run_config

PUBLISHED = Path(__file__).parent / "published"
LENGTH, BATCH, SEED = 2048, 2048, 6198  # both files' max_sequence_length, global_train_batch_size and seed
SIZES = (LENGTH * BATCH + 1000, LENGTH * BATCH // 2 + 7)  # 3,072 instances: 1.5 batches, the tail dropped


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two uint16 token files (OLMo's memmap_dtype default) with ids under the files' vocab_size 50280."""
    folder = tmp_path_factory.mktemp("published-tokens")
    rng = np.random.default_rng(41)
    paths = []
    for i, size in enumerate(SIZES):
        path = folder / f"part-{i}.npy"
        rng.integers(0, 50280, size=size, dtype=np.uint16).tofile(path)
        paths.append(path)
    return paths


def published(name: str, where: Path, paths: list[Path]) -> Path:
    """The published file with its data paths (its last lines, from `  paths:` on) swapped for `paths`."""
    text = (PUBLISHED / name).read_text()
    head = text[: text.index("\n  paths:\n") + len("\n  paths:\n")]
    out = where / name
    out.write_text(head + "".join(f"    - {p}\n" for p in paths))
    return out


def invoke(args: list[str]) -> str:
    result = CliRunner().invoke(data_main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def olmo_batch(paths: list[Path], step: int) -> list[tuple[str, int]]:
    """(token file, first token) of each instance of `step`, by OLMo's rule (module docstring)."""
    places = [(str(p), j * LENGTH) for p in paths for j in range(p.stat().st_size // 2 // LENGTH)]
    batches = len(places) // BATCH
    epoch, batch = divmod(step - 1, batches)
    order = np.random.Generator(np.random.PCG64(SEED + epoch)).permutation(len(places))
    return [places[int(i)] for i in order[batch * BATCH : (batch + 1) * BATCH]]


@pytest.mark.parametrize("name", ["OLMo-7B.yaml", "OLMo-1B.yaml"])
def test_published_configs_answer_every_data_command(
    name: str, tokens: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # OLMo-7B's save_folder is relative (runs/${run_name}): its order goes there
    # OLMo-1B's is ${path.choose:${oc.env:SCRATCH_DIR,no_exist}/checkpoints,/results}/${oc.env:SLURM_JOB_ID,...}
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.setenv("SCRATCH_DIR", str(tmp_path))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    config = str(published(name, tmp_path, tokens))
    stats = json.loads(invoke(["stats", config, "--json"]))
    assert read_run_config(config).save_folder in ("runs/OLMo-7B", f"{tmp_path}/checkpoints/OLMo-1B")
    assert json.dumps(stats).count(str(tokens[0])) >= 1
    assert "3,072 instances" in invoke(["stats", config])
    assert "epoch 0, 3,072 instances" in invoke(["build-order", config, "--epochs", "2"])
    for step in (1, 2):  # epoch 0's only batch, then epoch 1's (another permutation)
        shown = json.loads(invoke(["inspect-batch", config, "--step", str(step), "--json"]))
        assert (shown["sequence_length"], shown["global_batch_size"], shown["seed"]) == (LENGTH, BATCH, SEED)
        got = [(i["path"], i["token_offset"]) for i in shown["instances"]]
        assert got == olmo_batch(tokens, step)
        first = shown["instances"][0]
        path, offset = got[0]
        expected = np.fromfile(path, dtype=np.uint16, count=LENGTH, offset=2 * offset)
        assert first["token_ids"] == expected.tolist()
    # 24 tokens of step 2's first instance, traced to every step and position of steps 1-2 that held it
    ids = ",".join(map(str, first["token_ids"][:24]))
    traced = json.loads(invoke(["trace", config, "--tokens", ids, "--steps", "1..2", "--json"]))
    where = [(s, p) for s in (1, 2) for p, place in enumerate(olmo_batch(tokens, s)) if place == got[0]]
    assert [(h["step"], h["position"], h["path"]) for h in traced["hits"]] == [(s, p, path) for s, p in where]


@pytest.mark.parametrize("name", ["OLMo-7B.yaml", "OLMo-1B.yaml"])
def test_the_trainer_still_refuses_what_it_cannot_train(
    name: str, tokens: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SCRATCH_DIR", raising=False)  # OLMo-1B's save folder then names no folder that exists
    config = published(name, tmp_path, tokens)
    why = {
        "OLMo-7B.yaml": r'model\.init_fn is "mitchell"; only "normal" can be trained',
        "OLMo-1B.yaml": r"config key 'save_folder': \$\{path\.choose:.*\}: none of .* exists",
    }[name]
    with pytest.raises(ConfigError, match=why) as e:
        load_config(config)  # what `olmo-train train` reads a config with
    assert "\n" not in str(e.value)
    assert read_run_config(str(config)).model.max_sequence_length == LENGTH


MINIMAL = """\
model:
  d_model: 64
  n_heads: 4
  n_layers: 2
  mlp_ratio: 4
  rope: true
  include_bias: false
  block_type: sequential
  layer_norm_type: rms
  bias_for_layer_norm: false
  activation_type: swiglu
  max_sequence_length: 16
  vocab_size: 256
  embedding_size: 256
seed: 3
global_train_batch_size: 4
max_duration: 3
data:
  memmap_dtype: uint16
  paths: [{path}]
"""


def test_a_minimal_olmo_form_config_is_read_for_its_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No dropout keys: OLMo's defaults (0.1 each) and init_cutoff_factor null, refused for training only."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "tokens.npy"
    np.arange(16 * 12, dtype=np.uint16).tofile(path)
    config = tmp_path / "minimal.yaml"
    config.write_text(MINIMAL.format(path=path))
    with pytest.raises(ConfigError, match=r"model\.attention_dropout is 0\.1 \(OLMo's default: the key is absent\)"):
        load_config(config)
    invoke(["build-order", str(config)])
    shown = json.loads(invoke(["inspect-batch", str(config), "--step", "3", "--json"]))
    order = np.random.Generator(np.random.PCG64(3)).permutation(12)
    assert [i["instance"] for i in shown["instances"]] == order[8:12].tolist()
    assert shown["instances"][0]["token_ids"] == list(range(16 * int(order[8]), 16 * int(order[8]) + 16))
