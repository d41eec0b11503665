"""The training config: YAML + overrides, typed, and precise errors for bad keys and values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from olmo_data.config import ConfigError, load_config, parse_duration, save_config

REPO = Path(__file__).resolve().parents[3]


def write(tmp_path: Path, obj: object) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(obj))
    return path


BASE = {"data": {"paths": ["a.npy"]}, "model": {"d_model": 64, "n_heads": 4}}


def test_yaml_and_overrides(tmp_path: Path) -> None:
    cfg = load_config(
        write(tmp_path, BASE),
        [
            "--optimizer.learning_rate=1e-3",
            "--data.paths=[x.npy,y.npy]",
            "--max_duration",
            "2e9T",
            "--reset_trainer_state",
            "--model.n_kv_heads=2",
            "--load_path=null",
        ],
    )
    assert cfg.optimizer.learning_rate == 1e-3
    assert cfg.data.paths == ["x.npy", "y.npy"]
    assert cfg.max_duration == "2e9T" and parse_duration(cfg.max_duration) == (2e9, "tokens")
    assert cfg.reset_trainer_state is True
    assert cfg.model.n_kv_heads == 2 and cfg.model.d_model == 64
    assert cfg.load_path is None


def test_resolved_config_round_trips(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, BASE), ["--seed=7", "--optimizer.betas=[0.9,0.99]"])
    save_config(cfg, tmp_path / "out" / "config.yaml")
    again = load_config(tmp_path / "out" / "config.yaml")
    assert again == cfg and again.seed == 7 and again.optimizer.betas == [0.9, 0.99]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["--optimizer.learnin_rate=1"],
            r"unknown config key 'optimizer.learnin_rate'; did you mean 'optimizer.learning_rate'",
        ),
        (["--global_train_batch=4"], r"did you mean 'global_train_batch_size'"),
        (["--model.d_model=abc"], r"config key 'model.d_model': got 'abc' \(str\), expected int"),
        (
            ["--optimizer.learning_rate=fast"],
            r"'optimizer.learning_rate': got 'fast' \(str\), expected float",
        ),
        (
            ["--distributed_strategy=fsdp2"],
            r"'distributed_strategy': got 'fsdp2', expected one of .* did you mean 'fsdp'",
        ),
        (["--max_duration=10 steps"], r"'max_duration': got '10 steps', expected steps \(1000\), tokens"),
        (["--save_interval=1.5"], r"'save_interval': got 1.5, expected int \| None"),
        (["--data.paths=[]", "--data.mix=null"], r"no training data; set data.paths"),
        (["--model.n_heads=5"], r"'model.d_model': 64 is not divisible by model.n_heads=5"),
        (["--model.n_kv_heads=3"], r"'model.n_kv_heads': model.n_heads=4 is not a multiple of 3"),
        (["--data.label_mask_paths=[m1,m2]"], r"2 entries for 1 data.paths"),
        (["--model=3"], r"model: expected a mapping of keys, got 3"),
        (["optimizer.learning_rate=1"], r"expected an override like --key.sub=value"),
        (["--global_train_batch_size=0"], r"'global_train_batch_size': must be positive"),
    ],
)
def test_bad_keys_and_values_name_the_key(tmp_path: Path, overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, BASE), overrides)


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope.yaml: config file not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match=r"list.yaml: expected a mapping of config keys"):
        load_config(tmp_path / "list.yaml")
    (tmp_path / "bad.yaml").write_text("a: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML"):
        load_config(tmp_path / "bad.yaml")


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        (
            "bad.yaml",
            "a: 1\n b: [\n",
            r"bad\.yaml: not valid YAML \(mapping values are not allowed here at line 2, col",
        ),
        ("cut.json", '{"run_name": "x", "trainer": {"a": [1, 2,', r"cut\.json: not valid JSON: .*line 1, column 42"),
        ("deep.yaml", "[" * 50_000 + "]" * 50_000, r"deep\.yaml: nested too deeply to read"),
        ("binary.yaml", "\udcff", r"binary\.yaml: not UTF-8 text at byte 0"),
    ],
)
def test_an_unreadable_config_is_one_line(name: str, text: str, match: str, tmp_path: Path) -> None:
    """PyYAML's own message spans up to 8 lines (context, problem, a quote of the file); ours is one (issue 41)."""
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8", "surrogateescape"))
    with pytest.raises(ConfigError, match=match) as e:
        load_config(path)
    assert "\n" not in str(e.value)


def test_a_huge_config_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    with open(path, "wb") as f:
        f.truncate((64 << 20) + 1)  # sparse: nothing written, nothing read
    with pytest.raises(ConfigError, match=r"huge\.yaml: 67,108,865 bytes, over the 67,108,864 a config may have"):
        load_config(path)


def test_override_parsing() -> None:
    args = ["--model.n_layers=1", "--data.paths", "[x, y]", "--compile", "--restore-dataloader=off"]
    cfg = load_config(None, args)
    assert (cfg.model.n_layers, cfg.data.paths, cfg.compile, cfg.restore_dataloader) == (1, ["x", "y"], True, False)


def test_config_loader_does_not_import_torch() -> None:
    code = "import sys, olmo_data.config.load; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_cli_prints_config_errors_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "olmo_train", str(write(tmp_path, BASE)), "--optimizer.lr=1"],
        cwd=REPO,
        text=True,
        capture_output=True,
    )
    assert proc.returncode == 2
    assert "unknown config key 'optimizer.lr'" in proc.stderr and "Traceback" not in proc.stderr


def test_keys_lists_every_key_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m olmo_train --keys`: one line per leaf key of the config, its default as the config file would
    spell it, and the comment beside the field; the choices where the comment does not give them."""
    import dataclasses

    from olmo_data.config import CHOICES, TrainConfig, config_to_dict
    from olmo_train.train import main

    assert main(["--keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split(" = ", 1)[0]: line.split(" = ", 1)[1] for line in lines}

    def leaves(d: dict[str, object], prefix: str = "") -> dict[str, object]:
        out: dict[str, object] = {}
        for k, v in d.items():
            out |= leaves(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k: v}  # type: ignore[arg-type]
        return out

    defaults = leaves(config_to_dict(TrainConfig()))
    assert list(listed) == list(defaults)  # every key, in declaration order, nothing else
    for key, value in defaults.items():
        assert yaml.safe_load(listed[key].split("  ")[0]) == value, key
    for key, choices in CHOICES.items():
        assert all(c in listed[key] for c in choices), key
    assert "flex on GPUs, mask elsewhere" in listed["model.document_attention"]
    assert dataclasses.is_dataclass(TrainConfig().float8) and "float8.recipe" in listed
    assert main(["--help"]) == 0 and "--keys" in capsys.readouterr().out
