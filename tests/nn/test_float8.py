"""fp8 training through torchao (`float8:`), on CPU in torchao's emulation mode: which linears are converted, the
loss against the same run without fp8, a 2-process FSDP run with fp8 all-gather that resumes bitwise and writes
checkpoints without torchao types, no graph break in a converted block, the error without torchao, and the config
checks. No fp8 GPU here: the speed of fp8 is not measured by these tests, only that it trains what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from olmo_data.config import ConfigError, TrainConfig, load_config
from olmo_train.nn import Transformer, float8
from olmo_train.train import main

pytest.importorskip("torchao.float8", reason="the fp8 tests need torchao (the dev and gpu extras)")

SEQ = 32
CPU = torch.device("cpu")
TINY = ["--model.d_model=32", "--model.n_heads=2", "--model.n_layers=2", "--model.vocab_size=256"]


def model_config(*overrides: str) -> TrainConfig:
    model = [*TINY, f"--model.max_sequence_length={SEQ}"]
    return load_config(None, [*model, "--distributed_strategy=single", *overrides], require_data=False)


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A repeating pattern with 20% random tokens: learnable, so the loss falls clearly within a few steps."""
    rng = np.random.default_rng(0)
    a = np.tile((np.arange(50) * 7) % 251, 40)[: 40 * SEQ].astype(np.uint16)
    noise = rng.random(a.shape) < 0.2
    a[noise] = rng.integers(0, 256, int(noise.sum()))
    path = tmp_path_factory.mktemp("tokens") / "tokens.npy"
    a.tofile(path)
    return str(path)


def run_args(folder: Path, tokens: str, *overrides: str) -> list[str]:
    return [
        f"--save_folder={folder}",
        "--seed=3",
        "--max_duration=8",
        "--global_train_batch_size=8",
        "--device_train_microbatch_size=4",
        "--distributed_strategy=single",
        "--save_interval=null",
        *TINY,
        f"--model.max_sequence_length={SEQ}",
        "--optimizer.learning_rate=0.01",
        "--scheduler.t_warmup=2",
        f"--data.paths=[{tokens}]",
        *overrides,
    ]


def losses(folder: Path) -> list[float]:
    return [json.loads(line)["train/loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def test_conversion_swaps_exactly_the_block_linears_and_keeps_the_state_dict() -> None:
    # 4 heads sharing 1 kv head of size 8: w_k and w_v have 8 outputs, not a multiple of 16
    cfg = model_config("--model.n_heads=4", "--model.n_kv_heads=1", "--float8.enabled")
    model = Transformer(cfg.model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    names = float8.convert(model, cfg, CPU)
    from torchao.float8.float8_linear import Float8Linear

    fp8 = {name for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    expected = {f"blocks.{i}.{n}" for i in range(2) for n in ("attention.w_q", "attention.w_out")}
    expected |= {f"blocks.{i}.mlp.{n}" for i in range(2) for n in ("w_gate", "w_up", "w_down")}
    assert fp8 == expected == set(names)
    plain = {name for name, m in model.named_modules() if type(m) is nn.Linear}
    assert plain == {"lm_head"} | {f"blocks.{i}.attention.{n}" for i in range(2) for n in ("w_k", "w_v")}
    after = model.state_dict()
    assert list(after) == list(before), "checkpoints, unshard and export-hf rely on the plain model's keys"
    assert all(type(v) is torch.Tensor and torch.equal(v, before[k]) for k, v in after.items())


def test_nothing_to_convert_is_refused() -> None:
    cfg = model_config("--model.d_model=24", "--float8.enabled")
    with pytest.raises(ConfigError, match=r"'float8.enabled': no block linear .* multiples of 16 \(model.d_model=24"):
        float8.convert(Transformer(cfg.model), cfg, CPU)


@pytest.fixture(scope="module")
def plain(tokens: str, tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The losses of the run without fp8, which on CPU computes in fp32 (bf16 runs only on GPUs): a stricter
    reference than bf16."""
    folder = tmp_path_factory.mktemp("plain") / "run"
    assert main(run_args(folder, tokens)) == 0
    return losses(folder)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_fp8_loss_stays_close_to_the_plain_run(recipe: str, tmp_path: Path, tokens: str, plain: list[float]) -> None:
    """Measured: at most 0.31% (tensorwise) and 0.25% (rowwise) from the plain run over the 8 steps; the bar is 2%."""
    assert main(run_args(tmp_path / "fp8", tokens, "--float8.enabled", f"--float8.recipe={recipe}")) == 0
    fp8 = losses(tmp_path / "fp8")
    assert len(fp8) == 8
    assert fp8 != plain, "the fp8 run computed exactly what the plain one did: were the linears converted?"
    for step, (a, b) in enumerate(zip(plain, fp8, strict=True), 1):
        assert b == pytest.approx(a, rel=0.02), f"step {step}: fp8 {b:.4f} vs plain {a:.4f}"
    assert fp8[-1] < fp8[0] - 0.5, fp8


def test_a_converted_block_compiles_without_graph_breaks() -> None:
    cfg = model_config("--float8.enabled", "--model.n_layers=1")
    model = Transformer(cfg.model)
    float8.convert(model, cfg, CPU)
    x = torch.randn(2, SEQ, 32)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model.blocks[0])(x, model.rope_cos[:SEQ], model.rope_sin[:SEQ])
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_without_torchao_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "torchao" or m.startswith("torchao.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "torchao", None)
    cfg = model_config("--float8.enabled")
    with pytest.raises(ConfigError, match=r"'float8.enabled': fp8 training needs torchao; .*'olmo-data\[gpu\]'"):
        float8.convert(Transformer(cfg.model), cfg, CPU)
    assert float8.convert(Transformer(model_config().model), model_config(), CPU) == []  # fp8 off: no torchao


def test_the_trainer_imports_and_runs_without_torchao(tmp_path: Path, tokens: str) -> None:
    """A fresh interpreter in which torchao cannot be imported trains a step, saves and reads its checkpoint."""
    script = (
        "import sys; sys.modules['torchao'] = None\n"
        "from pathlib import Path\n"
        "from olmo_train.train import main\n"
        "from olmo_train.convert import read_model_state\n"
        f"assert main({run_args(tmp_path / 'run', tokens, '--max_duration=1', '--save_interval=1')!r}) == 0\n"
        f"assert read_model_state(Path({str(tmp_path / 'run' / 'step1')!r}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["--float8.enabled", "--float8.recipe=rowwize"], "'float8.recipe': got 'rowwize', .*did you mean 'rowwise'"),
        (["--float8.recipe=rowwise"], "'float8.recipe': set, but float8.enabled is not"),
        (["--float8.emulate"], "'float8.emulate': set, but float8.enabled is not"),
        (
            ["--float8.enabled", "--relora.rank=4", "--relora.merge_every=2"],
            "'float8.enabled': not with relora.rank; ReLoRA's adapted linears are not converted",
        ),
        (
            ["--float8.enabled", "--float8.recipe=rowwise", "--float8.fsdp_float8_all_gather"],
            "'float8.fsdp_float8_all_gather': torchao gathers fp8 weights only .* not with float8.recipe='rowwise'",
        ),
        (
            ["--float8.enabled", "--float8.fsdp_float8_all_gather", "--distributed_strategy=ddp"],
            "'float8.fsdp_float8_all_gather': an FSDP2 feature, but distributed_strategy is 'ddp'",
        ),
        (["--float8.enabled=yes please"], "'float8.enabled': got 'yes please' .*expected bool"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, ["--data.paths=[x.npy]", *overrides])


def test_emulate_false_without_fp8_hardware_is_refused() -> None:
    cfg = model_config("--float8.enabled", "--float8.emulate=false")
    with pytest.raises(ConfigError, match=r"'float8.emulate': false, but cpu has no fp8 matmuls .*capability 8.9"):
        float8.convert(Transformer(cfg.model), cfg, CPU)


def test_a_refused_start_leaves_no_save_folder(tmp_path: Path, tokens: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(run_args(tmp_path / "run", tokens, "--float8.enabled", "--float8.emulate=false")) == 2
    assert "'float8.emulate': false, but cpu has no fp8 matmuls" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_all_gather_defaults_to_where_torchao_supports_it() -> None:
    def gathers(*overrides: str) -> bool:
        return float8.fsdp_all_gather(load_config(None, ["--data.paths=[x.npy]", "--float8.enabled", *overrides]))

    assert gathers()  # tensorwise under fsdp
    assert not gathers("--float8.recipe=rowwise")
    assert not gathers("--distributed_strategy=ddp")
    assert not gathers("--float8.fsdp_float8_all_gather=false")


def launch(config: list[str], *overrides: str) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "olmo_train"]
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [*cmd, *config, *overrides], env={**os.environ, **env}, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_fsdp_fp8_all_gather_resumes_bitwise_with_plain_checkpoints(tmp_path: Path, tokens: str) -> None:
    """2 processes, FSDP2 with fp8 all-gather (tensorwise): stopped at step 3 and resumed from the sharded checkpoint,
    the run is bitwise the unstopped one, and no checkpoint file holds a torchao type (they load without it)."""
    fsdp = ["--distributed_strategy=fsdp", "--max_duration=6", "--save_interval=2", "--save_interval_unsharded=6"]
    fp8 = ["--float8.enabled", "--float8.fsdp_float8_all_gather"]
    launch(run_args(tmp_path / "ref", tokens, *fsdp, *fp8))
    resumed = run_args(tmp_path / "run", tokens, *fsdp, *fp8)
    launch(resumed, "--stop_at=3")
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")[:3]
    launch(resumed)
    assert losses(tmp_path / "run") == losses(tmp_path / "ref")
    ref = torch.load(tmp_path / "ref" / "step6-unsharded" / "model.pt", weights_only=True)
    got = torch.load(tmp_path / "run" / "step6-unsharded" / "model.pt", weights_only=True)
    assert ref.keys() == got.keys() and all(torch.equal(ref[k], got[k]) for k in ref)
    assert all(type(v) is torch.Tensor for v in got.values())
    for path in (tmp_path / "run").rglob("*"):
        if path.is_file():
            assert b"torchao" not in path.read_bytes(), f"{path} holds a torchao type"
    from olmo_train.convert import read_model_state

    sharded = read_model_state(tmp_path / "run" / "step6")  # export-hf's and generate's reader
    assert all(torch.equal(sharded[k], got[k]) for k in got)


def test_float8_keys_round_trip_through_the_saved_config(tmp_path: Path) -> None:
    from olmo_data.config import save_config

    cfg = model_config("--float8.enabled", "--float8.recipe=rowwise")
    save_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml", require_data=False)
    assert again.float8 == cfg.float8
