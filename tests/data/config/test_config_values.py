"""Config values checked by meaning (issue 27): nonsense of the right type is refused by key before anything
runs, strings are taken where a string is expected, and a huge value never makes a huge message."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from olmo_data.config import ConfigError, load_config

BASE = ["--data.paths=[a.npy]", "--model.d_model=64", "--model.n_heads=4"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--max_grad_norm=-1", r"'max_grad_norm': must be above 0 \(or null for no clipping\), got -1\.0"),
        ("--max_grad_norm=.nan", r"'max_grad_norm': must be a finite number, got nan"),
        ("--max_grad_norm=inf", r"'max_grad_norm': must be a finite number, got inf"),
        ("--optimizer.learning_rate=nan", r"'optimizer.learning_rate': must be a finite number, got nan"),
        ("--optimizer.learning_rate=-inf", r"'optimizer.learning_rate': must be a finite number, got -inf"),
        ("--optimizer.betas=[0.9,nan]", r"'optimizer.betas\[1\]': must be a finite number, got nan"),
        ("--model.init_std=inf", r"'model.init_std': must be a finite number"),
        ("--scheduler.alpha_f=-1", r"'scheduler.alpha_f': must be 0 or more, got -1\.0"),
        ("--relora.alpha=nan", r"'relora.alpha': must be a finite number, got nan"),
        ("--model.d_model=-64", r"'model.d_model': must be positive, got -64"),
        ("--model.n_layers=-1", r"'model.n_layers': must be positive, got -1"),
        ("--model.n_heads=0", r"'model.n_heads': must be positive, got 0"),
        ("--model.n_kv_heads=0", r"'model.n_kv_heads': must be positive, got 0"),
        ("--console_log_interval=0", r"'console_log_interval': must be positive, got 0"),
        ("--save_interval=0", r"'save_interval': must be positive, got 0"),
        ("--optimizer.learning_rate=-0.1", r"'optimizer.learning_rate': must be 0 or more, got -0\.1"),
        ("--optimizer.betas=[0.9,1.5]", r"'optimizer.betas': each must be in \[0, 1\), got \[0\.9, 1\.5\]"),
        ("--seed=-3", r"'seed': must be 0 or more, got -3"),
        ("--save_folder_lock_timeout_s=0", r"'save_folder_lock_timeout_s': must be above 0, got 0\.0"),
        ("--save_num_checkpoints_to_keep=0", r"'save_num_checkpoints_to_keep': got 0; -1 keeps every checkpoint"),
        ("--save_num_unsharded_checkpoints_to_keep=-2", r"'save_num_unsharded_checkpoints_to_keep': got -2"),
    ],
)
def test_nonsense_is_refused_by_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, override])


def test_what_the_rules_allow_still_loads() -> None:
    cfg = load_config(
        None,
        [*BASE, "--max_grad_norm=null", "--save_num_checkpoints_to_keep=1", "--save_interval=null", "--seed=0"],
    )
    assert cfg.max_grad_norm is None and cfg.save_num_checkpoints_to_keep == 1 and cfg.save_interval is None
    assert load_config(None, [*BASE, "--save_num_checkpoints_to_keep=-1"]).save_num_checkpoints_to_keep == -1


def test_a_nan_learning_rate_stops_the_trainer_in_one_line_leaving_no_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from olmo_train.train import main

    (tmp_path / "a.npy").write_bytes(bytes(4096))
    run = tmp_path / "run"
    args = [*BASE, f"--data.paths=[{tmp_path / 'a.npy'}]", f"--save_folder={run}", "--optimizer.learning_rate=nan"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == "error: config key 'optimizer.learning_rate': must be a finite number, got nan\n"
    assert not run.exists()


def test_a_string_key_takes_numbers_as_text(tmp_path: Path) -> None:
    assert load_config(None, [*BASE, "--run_name=2024"]).run_name == "2024"
    assert load_config(None, [*BASE, "--run_name=007", "--wandb.group=1e3"]).run_name == "007"
    assert load_config(None, [*BASE, "--wandb.group=1e3"]).wandb.group == "1e3"  # not the float 1000.0
    assert load_config(None, [*BASE, "--wandb.group=null"]).wandb.group is None
    (tmp_path / "c.yaml").write_text("run_name: 2024\ndata: {paths: [a.npy]}\n")
    assert load_config(tmp_path / "c.yaml").run_name == "2024"


def test_a_yaml_of_nested_aliases_is_refused_quickly_and_briefly(tmp_path: Path) -> None:
    """A few hundred bytes that expand to 10^18 list elements if printed (the repr of the value took 62 s, 6.4 GB
    and 2.1 GB of stderr): refused in seconds, naming the key, the value shown in 200 characters at most."""
    levels = ["&a0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 18)]
    path = tmp_path / "bomb.yaml"
    path.write_text(f"data: {{paths: [a.npy]}}\nmodel: {{d_model: [{', '.join(levels)}]}}\n")
    code = f"from olmo_data.config import load_config\nload_config({str(path)!r})"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - t0 < 60
    assert r.returncode != 0 and len(r.stderr) < 5000, len(r.stderr)
    line = r.stderr.strip().splitlines()[-1]
    assert "config key 'model.d_model': got [[" in line and len(line) < 400, line
