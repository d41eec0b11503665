"""OLMo-core's checkpoints in, with OLMo-core itself as the reference: a tiny model built from OLMo-core's own
TransformerConfig, stepped by its own optimizer inside its own train module and saved by its own Checkpointer (as its
Trainer saves, with config.json as its ConfigSaverCallback writes it), imports with `import-olmo-core`; our model's
logits are OLMo-core's forward's; one optimizer step from the imported AdamW state moves every weight as OLMo-core's
optimizer moves it from the same checkpoint; our trainer trains on from the import (weights only, and with the
optimizer state); what our model does not compute is refused by its config key, with nothing written."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.errors import DataError
from olmo_train.convert import import_olmo_core, load_model

try:  # OLMo-core is the reference: the olmo-core extra, which dev (and so CI) installs
    from olmo_core.data import TokenizerConfig
    from olmo_core.distributed.checkpoint import save_model_and_optim_state
    from olmo_core.nn.layer_norm import LayerNormType
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig
    from olmo_core.optim import AdamWConfig, OptimGroupOverride, SkipStepAdamWConfig
    from olmo_core.train.checkpoint import Checkpointer
    from olmo_core.train.train_module import TransformerTrainModuleConfig
    from olmo_core.train.utils import EnvRngStates
except ImportError:
    HAVE_CORE = False
else:
    HAVE_CORE = True
needs_core = pytest.mark.skipif(
    not HAVE_CORE, reason="ai2-olmo-core is not installed (the olmo-core extra; `pip install -e .[dev]` installs it)"
)
REPO = Path(__file__).resolve().parents[2]
VOCAB, ROWS, SEQ = 250, 256, 16  # the tokenizer's vocabulary; OLMo-core's embedding padded past it


def core_config(variant: str) -> TransformerConfig:
    """OLMo-core's own builders at a tiny size: OLMo 2's block (reordered norm, QK-norm, GQA), or the pre-norm
    llama-style block with tied embeddings, or with LayerNorm."""
    common: dict[str, Any] = dict(d_model=32, vocab_size=ROWS, n_layers=2, n_heads=4, hidden_size_multiple_of=16)
    if variant == "olmo2":
        return TransformerConfig.llama_like(
            **common, n_kv_heads=2, qk_norm=True, block_name=TransformerBlockType.reordered_norm, layer_norm_eps=1e-6
        )
    if variant == "llama-tied":
        return TransformerConfig.llama_like(**common, rope_theta=10_000, tie_word_embeddings=True)
    assert variant == "layer-norm"
    return TransformerConfig.llama_like(**common, layer_norm_name=LayerNormType.default, qk_norm=True)


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Every tensor random, norm scales too (at OLMo-core's init they are all 1: a misplaced norm would hide)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)


def batch(seed: int, n: int = 4) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(seed))


def lm_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1, :VOCAB].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def save_core_checkpoint(
    folder: Path,
    variant: str,
    *,
    optim: str | None = "skip_step",
    steps: int = 2,
    seed: int = 0,
    cfg: TransformerConfig | None = None,
) -> tuple[Path, Any]:
    """An OLMo-core step folder written as its Trainer writes one: the train module's state (model, and its
    optimizer's flattened state) by Checkpointer.save, train/rank0.pt with the trainer's counters and RNG states,
    and config.json as ConfigSaverCallback writes it (the experiment config's `as_config_dict()`). Returns the
    folder and OLMo-core's model (in eval mode). `cfg`: OLMo-core's model config, else core_config(variant)'s."""
    cfg = cfg if cfg is not None else core_config(variant)
    model = cfg.build(init_device="cpu")
    randomize(model, seed)
    no_decay = [OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))]
    optim_cfg = (
        SkipStepAdamWConfig(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, group_overrides=no_decay)
        if optim == "skip_step"
        else AdamWConfig(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-7)
    )
    tm_cfg = TransformerTrainModuleConfig(rank_microbatch_size=4 * SEQ, max_sequence_length=SEQ, optim=optim_cfg)
    tm = tm_cfg.build(model)
    assert tm.optim is not None
    for step in range(steps if optim else 0):
        tm.optim.zero_grad()
        loss = lm_loss(tm.model(batch(100 + step)), batch(100 + step))
        loss.backward()
        if optim == "skip_step":
            tm.optim.latest_loss = loss.detach()  # type: ignore[attr-defined]
        tm.optim.step()
    step_dir = folder / f"step{steps}"
    checkpointer = Checkpointer(work_dir=folder / "work")
    train_state = {"global_step": steps, "global_train_tokens_seen": steps * 4 * SEQ, "epoch": 1}
    train_state |= {"world_size": 1, "rng": EnvRngStates.current_state().as_dict(), "callbacks": {}}
    if optim is None:
        tm.optim = None  # a run without an optimizer (eval-only): the checkpoint holds the model alone
    checkpointer.save(step_dir, tm, train_state)
    tokenizer = TokenizerConfig(vocab_size=VOCAB, eos_token_id=VOCAB - 1, pad_token_id=VOCAB - 2)
    experiment = {
        "run_name": f"tiny-{variant}",
        "model": cfg.as_config_dict(),
        "dataset": {"sequence_length": SEQ, "tokenizer": tokenizer.as_config_dict()},
        "train_module": tm_cfg.as_config_dict(),
        "trainer": {"save_folder": str(folder)},
    }
    checkpointer.write_file(step_dir, "config.json", json.dumps(experiment))
    return step_dir, model.eval()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


@needs_core
@pytest.mark.parametrize("variant", ["olmo2", "llama-tied", "layer-norm"])
def test_an_olmo_core_checkpoint_imports_with_olmo_cores_logits(variant: str, tmp_path: Path) -> None:
    source, core = save_core_checkpoint(tmp_path / "core", variant)
    ids = batch(7, n=2)
    with torch.no_grad():
        expected = core(ids)
    result = CliRunner().invoke(olmo_train_cli, ["import-olmo-core", str(source), "--destination", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "2 layers, d_model 32, vocab 250" in result.stdout and "with optimizer state" in result.stdout
    ours, _ = load_model(tmp_path / "o")
    direct, _ = load_model(source)  # OLMo-core's step folder itself, without an import
    with torch.no_grad():
        for model in (ours, direct):
            got = model(ids)
            print(f"{variant}: max abs logit difference {max_diff(got, expected):.3g}")
            assert got.shape == expected.shape == (2, SEQ, ROWS) and max_diff(got, expected) <= 1e-5

    cfg = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())
    assert (cfg["model"]["vocab_size"], cfg["model"]["embedding_size"]) == (VOCAB, ROWS)
    assert cfg["model"]["norm_after"] is (variant == "olmo2")
    assert cfg["model"]["weight_tying"] is (variant == "llama-tied")
    assert cfg["reset_trainer_state"] is True and cfg["reset_optimizer_state"] is False
    assert cfg["optimizer"]["decay_embeddings"] is False and cfg["optimizer"]["learning_rate"] == 1e-2
    lineage = json.loads((tmp_path / "o" / "trainer_state.json").read_text())["lineage"]
    assert [(r["source"], r["step"], r["tokens_seen"], r["run_name"]) for r in lineage] == [
        ("import-olmo-core", 2, 2 * 4 * SEQ, f"tiny-{variant}")
    ]


@needs_core
@pytest.mark.parametrize("variant,optim", [("olmo2", "adamw"), ("olmo2", "skip_step"), ("llama-tied", "adamw")])
def test_one_step_from_the_imported_optimizer_state_is_olmo_cores_step(
    variant: str, optim: str, tmp_path: Path
) -> None:
    """OLMo-core loads its checkpoint into a fresh train module and steps once; our model and optimizer, loaded
    from the import as the trainer loads a checkpoint, step once on the same batch: every weight agrees, so the
    moments, step counts, learning rate, betas, eps and each parameter's weight decay all came across."""
    from olmo_data.config import load_config
    from olmo_train.checkpoint import load_checkpoint
    from olmo_train.distributed import Dist
    from olmo_train.nn import Transformer
    from olmo_train.train import build_optimizer

    source, _ = save_core_checkpoint(tmp_path / "core", variant, optim=optim, steps=3)
    dest = import_olmo_core(str(source), tmp_path / "ours")
    ids = batch(50)

    cfg = core_config(variant)
    core_model = cfg.build(init_device="cpu")
    opt_cfg = json.loads((source / "config.json").read_text())["train_module"]
    tm = TransformerTrainModuleConfig(
        rank_microbatch_size=4 * SEQ,
        max_sequence_length=SEQ,
        optim=SkipStepAdamWConfig(
            lr=1e-2,
            betas=(0.9, 0.95),
            weight_decay=0.1,
            group_overrides=[OptimGroupOverride(params=["embeddings.weight"], opts=dict(weight_decay=0.0))],
        )
        if optim == "skip_step"
        else AdamWConfig(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-7),
    ).build(core_model)
    assert opt_cfg["optim"]["lr"] == 1e-2
    Checkpointer(work_dir=tmp_path / "work").load(source, tm)
    assert tm.optim is not None and all(float(s["step"]) == 3 for s in tm.optim.state.values())  # moments loaded
    loss = lm_loss(tm.model(ids), ids)
    loss.backward()
    if optim == "skip_step":
        tm.optim.latest_loss = loss.detach()  # type: ignore[attr-defined]
    tm.optim.step()

    ours_cfg = load_config(dest / "config.yaml", require_data=False)
    model = Transformer(ours_cfg.model)
    opt = build_optimizer(model, ours_cfg.optimizer)
    load_checkpoint(dest, model, opt, Dist(0, 1, 0, torch.device("cpu")), restore_rng=False)
    lm_loss(model(ids), ids).backward()
    opt.step()

    from olmo_train.convert.olmo_core import their_name

    theirs = core_model.state_dict()
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and ours_cfg.model.weight_tying:
            continue
        core_name = their_name(name)
        assert core_name is not None
        assert max_diff(tensor, theirs[core_name]) <= 1e-6, name
    assert max_diff(model.embeddings.weight, theirs["embeddings.weight"]) <= 1e-6


@needs_core
def test_our_trainer_trains_on_from_an_import_weights_only_and_with_optimizer_state(tmp_path: Path) -> None:
    """The import's own config.yaml, given data: its first step's loss is OLMo-core's model's loss on that batch,
    whether it keeps OLMo-core's optimizer state or starts a fresh one (--weights-only)."""
    from olmo_data.run.batches import inspect_batch
    from olmo_train.train import main

    source, core = save_core_checkpoint(tmp_path / "core", "olmo2")
    tokens = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, VOCAB, 16 * SEQ).astype(np.uint16).tofile(tokens)
    for name, weights_only in (("with-optim", False), ("weights-only", True)):
        dest = import_olmo_core(str(source), tmp_path / name, weights_only=weights_only)
        assert (dest / "optim.pt").is_file() is not weights_only
        cfg = yaml.safe_load((dest / "config.yaml").read_text())
        assert cfg["reset_optimizer_state"] is (None if weights_only else False)
        cfg.update(
            save_folder=str(tmp_path / f"{name}-run"),
            max_duration=2,
            global_train_batch_size=4,
            device_train_microbatch_size=4,
            distributed_strategy="single",
            data={"paths": [str(tokens)]},
        )
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        assert main([str(tmp_path / f"{name}.yaml")]) == 0
        records = (tmp_path / f"{name}-run" / "metrics.jsonl").read_text().splitlines()
        logged = [json.loads(line)["train/loss"] for line in records]
        instances = inspect_batch(str(tmp_path / f"{name}.yaml"), step=1).instances
        ids = torch.tensor(np.array([i.token_ids for i in instances]).astype(np.int64))
        with torch.no_grad():
            logits = core(ids)[:, :-1]  # our trainer's loss, as OLMo-core's, is over every row of the padded head
            expected = float(F.cross_entropy(logits.reshape(-1, ROWS), ids[:, 1:].reshape(-1)))
        assert len(logged) == 2 and np.isfinite(logged).all()
        assert logged[0] == pytest.approx(expected, rel=1e-5), name


# ---- refusals: one line naming the key, nothing written -----------------------------------------------------


def edit(config: dict[str, Any], path: str, value: Any) -> None:
    """Set (or, with value ..., remove) the dotted key `path` of config.json."""
    *parents, last = path.split(".")
    node = config
    for key in parents:
        node = node[key]
    if value is ...:
        del node[last]
    else:
        node[last] = value


REFUSED: dict[str, tuple[str, Any, str]] = {
    "attention-bias": (
        "model.block.sequence_mixer.bias",
        ...,
        r"model\.block\.sequence_mixer\.bias is true \(OLMo-core's default: the key is absent\); only false",
    ),  # noqa: E501
    "mlp-bias": ("model.block.feed_forward.bias", True, r"model\.block\.feed_forward\.bias is true; only false"),
    "moe": ("model.block.feed_forward_moe", {"num_experts": 8}, r"model\.block\.feed_forward_moe is .*; only null"),
    "moe-model": ("model.name", "moe", r"model\.name is 'moe'; only 'default' can be imported \(a dense decoder"),
    "block": ("model.block.name", "peri_norm", r"model\.block\.name is 'peri_norm'; only 'reordered_norm' or"),
    "sliding-window": (
        "model.block.sequence_mixer.sliding_window",
        {"pattern": [4096, -2]},
        r"sliding_window\.pattern is \[4096, -2\]; expected window sizes",
    ),  # the form that imports: tests/convert/test_import_olmo_core_olmo3.py
    "complex-rope": ("model.block.sequence_mixer.rope.name", "complex", r"rope\.name is 'complex'; only 'default' or"),
    "no-rope": ("model.block.sequence_mixer.rope", ..., r"model\.block\.sequence_mixer\.rope is absent \(no positions"),
    "head-qk-norm": ("model.block.sequence_mixer.use_head_qk_norm", True, r"use_head_qk_norm is true; only false"),
    "qwen-norm": ("model.block.layer_norm.name", "qwen_rms", r"model\.block\.layer_norm\.name is 'qwen_rms'; only"),
    "norm-bias": ("model.lm_head.layer_norm.bias", ..., r"model\.lm_head\.layer_norm\.bias is true \(OLMo-core's de"),
    "lm-head-bias": ("model.lm_head.bias", True, r"model\.lm_head\.bias is true; only false"),
    "kv-heads": ("model.block.sequence_mixer.n_kv_heads", 3, r"sequence_mixer\.n_kv_heads 3 does not divide n_heads 4"),
    "embed-scale": ("model.embed_scale", 5.6, r"model\.embed_scale is 5\.6; only null"),
    "unknown-key": ("model.block.sequence_mixer.new_thing", 3, r"sequence_mixer\.new_thing is 3, an OLMo-core option"),
    "attention-class": (
        "model.block.sequence_mixer._CLASS_",
        "olmo_core.nn.attention.recurrent.GatedDeltaNetConfig",
        r"sequence_mixer is a olmo_core\.nn\.attention\.recurrent\.GatedDeltaNetConfig; only AttentionConfig",
    ),  # noqa: E501
    "optimizer": (
        "train_module.optim._CLASS_",
        "olmo_core.optim.lion.LionConfig",
        r"train_module\.optim is a olmo_core\.optim\.lion\.LionConfig; only AdamWConfig or SkipStepAdamWConfig",
    ),  # noqa: E501
    "group-override": (
        "train_module.optim.group_overrides",
        [{"params": ["*norm*"], "opts": {"lr": 0.1}}],
        r"group_overrides\[0\] is .*give --weights-only",
    ),  # noqa: E501
}


@pytest.fixture(scope="module")
def core_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_core_checkpoint(tmp_path_factory.mktemp("core"), "olmo2")[0]


@needs_core
@pytest.mark.parametrize("case", list(REFUSED))
def test_what_our_model_does_not_compute_is_refused_by_key(case: str, core_source: Path, tmp_path: Path) -> None:
    key, value, match = REFUSED[case]
    source = tmp_path / core_source.name
    shutil.copytree(core_source, source)
    config = json.loads((source / "config.json").read_text())
    edit(config, key, value)
    (source / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(olmo_train_cli, ["import-olmo-core", str(source), "--destination", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.search(match, lines[0]) and "config.json" in lines[0], result.stderr
    assert not (tmp_path / "o").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@needs_core
def test_weights_only_imports_past_an_optimizer_it_cannot_map(
    core_source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / core_source.name
    shutil.copytree(core_source, source)
    config = json.loads((source / "config.json").read_text())
    edit(config, "train_module.optim._CLASS_", "olmo_core.optim.lion.LionConfig")
    (source / "config.json").write_text(json.dumps(config))
    monkeypatch.setenv("OLMO_PROGRESS", "1")  # the stages' bar, as a terminal shows it
    dest = import_olmo_core(str(source), tmp_path / "o", weights_only=True)
    assert not (dest / "optim.pt").exists() and (dest / "model.pt").is_file()
    bar = capsys.readouterr().err
    assert "import-olmo-core: 0/2, reading weights [" in bar and "import-olmo-core: 2/2, writing [" in bar, bar


@needs_core
def test_other_inputs_are_refused(core_source: Path, tmp_path: Path) -> None:
    source = tmp_path / core_source.name
    shutil.copytree(core_source, source)
    (source / "config.json").rename(tmp_path / "elsewhere.json")
    with pytest.raises(DataError, match=r"step2: no config\.json; OLMo-core's ConfigSaverCallback writes the run's"):
        import_olmo_core(str(source), tmp_path / "o")
    dest = import_olmo_core(str(source), tmp_path / "o", config=str(tmp_path / "elsewhere.json"))
    shutil.copy(tmp_path / "elsewhere.json", source / "config.json")  # its model_and_optim/ given directly
    direct = import_olmo_core(str(source / "model_and_optim"), tmp_path / "direct")
    assert (direct / "model.pt").read_bytes() == (dest / "model.pt").read_bytes()
    (source / "config.json").unlink()
    with pytest.raises(DataError, match=r"a checkpoint of this project \(trainer_state\.json\), not OLMo-core's"):
        import_olmo_core(str(dest), tmp_path / "o2")
    with pytest.raises(DataError, match=r"the destination exists"):
        import_olmo_core(str(source), dest, config=str(tmp_path / "elsewhere.json"))
    with pytest.raises(DataError, match=r"no model_and_optim/\.metadata; give an OLMo-core step folder"):
        import_olmo_core(str(tmp_path), tmp_path / "o3")
    with pytest.raises(DataError, match=r"read from a local directory; copy the step folder here first"):
        import_olmo_core("s3://bucket/run/step2", tmp_path / "o3")
    # a .metadata crafted to run code when unpickled is refused before anything else is read
    import pickle

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("unpickled!",))

    (source / "model_and_optim" / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(DataError, match=r"refers to builtins\.print, which checkpoint metadata is not made of"):
        import_olmo_core(str(source), tmp_path / "o3", config=str(tmp_path / "elsewhere.json"))
    assert not (tmp_path / "o3").exists()


@needs_core
def test_the_nested_optimizer_state_of_save_model_and_optim_state_imports_as_the_flattened(tmp_path: Path) -> None:
    """OLMo-core's `save_model_and_optim_state` (its default: the optimizer state nested, not flattened per
    parameter as its train module saves it) gives the same import."""
    source, _ = save_core_checkpoint(tmp_path / "core", "olmo2")
    nested = tmp_path / "nested" / "step2"
    nested.mkdir(parents=True)
    shutil.copy(source / "config.json", nested / "config.json")
    tm = TransformerTrainModuleConfig(
        rank_microbatch_size=4 * SEQ, max_sequence_length=SEQ, optim=SkipStepAdamWConfig(lr=1e-2)
    ).build(core_config("olmo2").build(init_device="cpu"))
    Checkpointer(work_dir=tmp_path / "work").load(source, tm)  # into a fresh module, as a resume loads it
    assert tm.optim is not None and all(len(s) == 3 for s in tm.optim.state.values())
    save_model_and_optim_state(nested / "model_and_optim", tm.model, tm.optim)
    a = import_olmo_core(str(source), tmp_path / "a")
    b = import_olmo_core(str(nested), tmp_path / "b")
    for name in ("model.pt", "optim.pt"):
        x, y = (torch.load(d / name, weights_only=True) for d in (a, b))
        assert repr(x) == repr(y), name  # every tensor and hyperparameter, printed in full


def test_import_olmo_core_needs_no_olmo_core() -> None:
    """The import reads OLMo-core's files without its library (only the tests use it)."""
    import subprocess
    import sys

    code = "import sys; sys.modules['olmo_core'] = None; import olmo_train.convert.olmo_core, cli.import_olmo_core"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


def _fsdp_save(rank: int, world: int, out: str, port: int) -> None:
    """One rank of a 2-rank OLMo-core run under its own FSDP (gloo, CPU): one step, then its Checkpointer's save."""
    import os

    import torch.distributed as dist
    from olmo_core.distributed.parallel import DataParallelType
    from olmo_core.train.train_module.transformer.config import TransformerDataParallelConfig

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world)}
    os.environ.update(env | {"LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world)})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = core_config("olmo2").build(init_device="cpu")
    randomize(model, 0)
    tm_cfg = TransformerTrainModuleConfig(
        rank_microbatch_size=4 * SEQ,
        max_sequence_length=SEQ,
        optim=AdamWConfig(lr=1e-2, betas=(0.9, 0.95)),
        dp_config=TransformerDataParallelConfig(name=DataParallelType.fsdp),
    )
    tm = tm_cfg.build(model, device=torch.device("cpu"))
    assert tm.optim is not None
    ids = batch(100 + rank)
    lm_loss(tm.model(ids), ids).backward()
    tm.optim.step()
    checkpointer = Checkpointer(work_dir=Path(out) / "work", process_group=dist.group.WORLD)
    checkpointer.save(Path(out) / "step1", tm, {"global_step": 1, "global_train_tokens_seen": 2 * 4 * SEQ})
    if rank == 0:
        config = {"model": core_config("olmo2").as_config_dict(), "train_module": tm_cfg.as_config_dict()}
        checkpointer.write_file(Path(out) / "step1", "config.json", json.dumps(config))
    dist.destroy_process_group()


@needs_core
@pytest.mark.slow
def test_a_checkpoint_of_a_two_rank_fsdp_run_imports_whole(tmp_path: Path) -> None:
    """OLMo-core's real runs are sharded: a checkpoint its FSDP wrote from 2 ranks (each tensor in 2 pieces, in
    2 ranks' shard files) imports as OLMo-core itself loads it into one process: the same logits and the same AdamW
    moments."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_fsdp_save, args=(2, str(tmp_path / "core"), port), nprocs=2)
    source = tmp_path / "core" / "step1"
    assert len(list((source / "model_and_optim").glob("__1_*.distcp"))) > 0  # rank 1 wrote shards of its own
    tm = TransformerTrainModuleConfig(
        rank_microbatch_size=4 * SEQ, max_sequence_length=SEQ, optim=AdamWConfig(lr=1e-2)
    ).build(core_config("olmo2").build(init_device="cpu"))
    Checkpointer(work_dir=tmp_path / "work").load(source, tm)
    assert tm.optim is not None
    dest = import_olmo_core(str(source), tmp_path / "ours")
    ours, _ = load_model(dest)
    ids = batch(7, n=2)
    with torch.no_grad():
        assert max_diff(ours(ids), tm.model.eval()(ids)) <= 1e-5
    from olmo_train.convert.olmo_core import their_name

    optim = torch.load(dest / "optim.pt", weights_only=True)
    core_state = {name: tm.optim.state[p] for name, p in tm.model.named_parameters()}
    assert set(optim["state"]) == {k for k in ours.state_dict() if k != "lm_head.weight" or not ours.cfg.weight_tying}
    for name, state in optim["state"].items():
        core = core_state[str(their_name(name))]
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], core[key].reshape(state[key].shape)), (name, key)
