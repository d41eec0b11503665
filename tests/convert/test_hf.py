"""Hugging Face export and import: an exported checkpoint is, for `transformers`, the model that was trained (same
logits on real text, same tokenizer ids), importing it back gives the very same tensors, `--check` names the block
a broken conversion breaks, and bad input is refused with a message and leaves nothing behind."""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.config import DataConfig, ModelConfig, TrainConfig, load_config
from olmo_data.errors import DataError
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.tokenizer import load_tokenizer
from olmo_train import checkpoint as ckpt
from olmo_train.convert import (
    compare_with_transformers,
    expected_hf_names,
    export_hf,
    hf_config,
    import_hf,
    read_hf_dir,
)
from olmo_train.distributed import Dist
from olmo_train.nn import Transformer
from olmo_train.train import build_optimizer

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
SINGLE = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
VOCAB = 2048  # the demo tokenizer's
BASE: dict[str, Any] = {"d_model": 64, "n_heads": 4, "n_layers": 3, "vocab_size": VOCAB, "max_sequence_length": 64}
LLAMA = {"norm_after": False, "attention_layer_norm": False}
SHAPES: dict[str, dict[str, Any]] = {
    "olmo2": {},
    "olmo2-gqa-tied": {"n_kv_heads": 2, "weight_tying": True},
    "olmo2-padded": {"embedding_size": 2112, "rope_theta": 10_000.0},
    "llama-gqa": {**LLAMA, "n_kv_heads": 1},
    "llama-tied-padded": {**LLAMA, "weight_tying": True, "embedding_size": 2112},
}


def model_config(**overrides: Any) -> ModelConfig:
    return ModelConfig(**{**BASE, "init_std": 0.1, **overrides})


def save_checkpoint(folder: Path, model_cfg: ModelConfig, data: list[str], *, sharded: bool, seed: int = 0) -> Path:
    """stepN of a model after one optimizer step, written by the trainer's own save functions."""
    cfg = TrainConfig(save_folder=str(folder), model=model_cfg, data=DataConfig(paths=data))
    torch.manual_seed(seed)
    model = Transformer(model_cfg)
    optim = build_optimizer(model, cfg.optimizer)
    model(torch.randint(0, model_cfg.vocab_size, (2, 8))).float().logsumexp(-1).mean().backward()
    optim.step()
    state = ckpt.TrainerState(step=1, seed=cfg.seed)
    with warnings.catch_warnings():  # DCP without a process group warns that it saves from one process
        warnings.simplefilter("ignore")
        save = ckpt.save_sharded if sharded else ckpt.save_unsharded
        return save(folder, model, optim, state, -1, SINGLE, cfg)


def unsharded_weights(path: Path) -> dict[str, torch.Tensor]:
    from olmo_train.convert import read_model_state

    return read_model_state(path)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".tmp-"))


def stdlib_text() -> str:
    import json as json_module

    return inspect.getsource(json_module)[:3000] + inspect.getsource(textwrap)[:3000]


@pytest.fixture(scope="module")
def tokens(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A token directory whose manifest records the demo tokenizer (the run's data)."""
    out = tmp_path_factory.mktemp("tokens") / "tokens"
    tokenize(demo_corpus[:1], out, TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    return str(out)


@pytest.fixture(scope="module")
def exported(tokens: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """shape -> (its checkpoint, its export). Sharded and unsharded checkpoints alternate; one export is sharded."""
    out = {}
    for n, (name, shape) in enumerate(SHAPES.items()):
        folder = tmp_path_factory.mktemp(name)
        source = save_checkpoint(folder / "run", model_config(**shape), [tokens], sharded=n % 2 == 0, seed=n)
        shard_bytes = 100_000 if name == "olmo2" else 5 * 10**9
        out[name] = source, export_hf(source, folder / "hf", max_shard_bytes=shard_bytes)
    return out


@pytest.mark.parametrize("shape", list(SHAPES))
def test_transformers_gives_our_logits_and_tokens(
    shape: str, exported: dict[str, tuple[Path, Path]], demo_tokenizer: str
) -> None:
    source, hf_dir = exported[shape]
    model_cfg = model_config(**SHAPES[shape])
    config = json.loads((hf_dir / "config.json").read_text())
    assert config["model_type"] == ("llama" if "llama" in shape else "olmo2")
    assert config["vocab_size"] == (model_cfg.embedding_size or VOCAB)
    assert config["num_key_value_heads"] == (model_cfg.n_kv_heads or model_cfg.n_heads)
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == model_cfg.rope_theta
    assert (
        config["rms_norm_eps"] == model_cfg.layer_norm_eps and config["tie_word_embeddings"] is model_cfg.weight_tying
    )
    assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (0, 1, None)
    if shape == "olmo2":
        assert (hf_dir / "model.safetensors.index.json").is_file() and not (hf_dir / "model.safetensors").exists()

    tok = load_tokenizer(demo_tokenizer, "hf")
    text = stdlib_text()
    hf_tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert hf_tok(text, add_special_tokens=True)["input_ids"] == tok.encode(text)
    assert (hf_tok.eos_token_id, hf_tok.pad_token_id) == (0, 1)
    assert (hf_dir / "tokenizer.json").read_bytes() == Path(demo_tokenizer).read_bytes()

    ids = torch.tensor(tok.encode(text)[: 2 * 64]).view(2, 64)
    ours = Transformer(model_cfg)
    ours.load_state_dict(unsharded_weights(source))
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    with torch.no_grad():
        expected = ours.eval()(ids)
        got = hf(input_ids=ids).logits
    diff = float((got - expected).abs().max())
    print(f"{shape}: max abs logit difference {diff:.3g} (logits up to {float(expected.abs().max()):.3g})")
    assert got.dtype == torch.float32 and diff <= 1e-5


def test_export_prints_nothing_from_libraries_it_does_not_use(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """torchao (imported by transformers when installed) printed 'Failed to load ..._C_mxfp8...so' and torch
    `_pytree` warnings, and transformers a progress bar, on every export: lines a newcomer reads as errors. They
    are shown with --verbose only."""
    source, _ = exported["olmo2"]
    outputs = {}
    for flags in ([], ["--verbose"]):
        dest = tmp_path / f"hf{len(flags)}"
        cmd = [
            sys.executable,
            "-m",
            "olmo_cli.train_main",
            *flags,
            "export-hf",
            str(source),
            "--destination",
            str(dest),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        outputs[bool(flags)] = proc.stdout + proc.stderr
    quiet = outputs[False]
    ours = ("checked the written tensor names", str(tmp_path))  # our plain lines: no `INFO module:` prefix
    assert not [line for line in quiet.splitlines() if not line.startswith(ours)], quiet
    if importlib.util.find_spec("torchao") is not None:  # what is hidden is still there for --verbose
        assert "torchao" in outputs[True]


def test_exported_files_all_get_the_usual_mode(exported: dict[str, tuple[Path, Path]]) -> None:
    """safetensors writes its files 0600; an export is shared, so each of its files gets what `open` gives."""
    umask = os.umask(0)
    os.umask(umask)
    for _source, hf_dir in exported.values():
        modes = {p.name: p.stat().st_mode & 0o777 for p in hf_dir.iterdir() if p.is_file()}
        assert any(name.endswith(".safetensors") for name in modes)
        assert set(modes.values()) == {0o666 & ~umask}, modes


@pytest.mark.parametrize("shape", list(SHAPES))
def test_export_then_import_is_bitwise(shape: str, exported: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    source, hf_dir = exported[shape]
    dest = import_hf(str(hf_dir), tmp_path / "imported")
    original = unsharded_weights(source)
    imported = torch.load(dest / "model.pt", weights_only=True)
    assert list(imported) == list(Transformer(model_config(**SHAPES[shape])).state_dict())
    assert set(imported) == set(original)
    for key, tensor in original.items():
        assert imported[key].dtype == tensor.dtype and torch.equal(imported[key], tensor), key
    tied = imported["lm_head.weight"].data_ptr() == imported["embeddings.weight"].data_ptr()
    assert tied is SHAPES[shape].get("weight_tying", False)

    cfg = load_config(dest / "config.yaml", require_data=False)
    want = model_config(**SHAPES[shape])
    want.n_kv_heads = want.n_kv_heads or want.n_heads
    want.mlp_hidden_size = 256  # 8/3 * 64 rounded up to 128, now explicit
    assert cfg.model == want
    assert cfg.load_path == str(dest.resolve()) and cfg.reset_trainer_state and cfg.data.paths == []
    assert ckpt.read_trainer_state(dest).step == 0
    assert (dest / "tokenizer.json").read_bytes() == (hf_dir / "tokenizer.json").read_bytes()
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("model_type", ["olmo2", "llama"])
@pytest.mark.parametrize("tied", [False, True])
def test_the_table_names_every_transformers_tensor(model_type: str, tied: bool) -> None:
    model_cfg = model_config(weight_tying=tied, **(LLAMA if model_type == "llama" else {}))
    config = hf_config(model_cfg, bos_token_id=None, eos_token_id=0, pad_token_id=1)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    names = set(hf.state_dict()) - ({"lm_head.weight"} if tied else set())
    assert expected_hf_names(model_cfg) == names


def test_check_passes_on_a_good_export_and_names_the_broken_block(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    from safetensors.torch import load_file, save_file

    source, _ = exported["llama-gqa"]
    model_cfg = model_config(**SHAPES["llama-gqa"])
    good = export_hf(source, tmp_path / "good", check=True)
    state = unsharded_weights(source)
    assert compare_with_transformers(good, model_cfg, state) <= 1e-5

    def broken(name: str, edit: Any) -> Path:
        directory = tmp_path / name
        shutil.copytree(good, directory)
        weights = load_file(directory / "model.safetensors")
        edit(weights)
        save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
        return directory

    def swap_mlps(w: dict[str, torch.Tensor]) -> None:
        a, b = "model.layers.1.mlp.down_proj.weight", "model.layers.2.mlp.down_proj.weight"
        w[a], w[b] = w[b], w[a]

    cases = {
        "block 1": swap_mlps,
        "block 2": lambda w: w["model.layers.2.post_attention_layernorm.weight"].mul_(1.5),
        "final norm": lambda w: w["model.norm.weight"].mul_(1.5),
    }
    for stage, edit in cases.items():
        with pytest.raises(DataError, match=f"first differs at {stage}:"):
            compare_with_transformers(broken(stage.replace(" ", "-"), edit), model_cfg, state)


def test_import_check_and_the_commands(exported: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    source, hf_dir = exported["olmo2-gqa-tied"]
    runner = CliRunner()
    result = runner.invoke(olmo_train_cli, ["import-hf", str(hf_dir), "--destination", str(tmp_path / "in"), "--check"])
    assert result.exit_code == 0, result.output
    assert "3 layers" in result.stdout and "checked" in result.stdout and "--reset_trainer_state" in result.stdout
    args = ["export-hf", str(tmp_path / "in"), "--destination", str(tmp_path / "out"), "--dtype", "bfloat16"]
    result = runner.invoke(olmo_train_cli, [*args, "--check"])
    assert result.exit_code == 0, result.output
    assert "olmo2 3 layers" in result.stdout and "bfloat16" in result.stdout and "with tokenizer" in result.stdout
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert (config["eos_token_id"], config["pad_token_id"]) == (0, 1)  # from the imported tokenizer_config.json
    _, state = read_hf_dir(str(tmp_path / "out"))
    assert state["embeddings.weight"].dtype == torch.bfloat16
    again = runner.invoke(olmo_train_cli, args)
    assert again.exit_code == 2 and "the destination exists" in again.output
    assert leftovers(tmp_path) == []


def test_export_without_transformers_checks_the_tensor_names(
    exported: dict[str, tuple[Path, Path]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, _ = exported["llama-tied-padded"]
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name))
    dest = export_hf(source, tmp_path / "hf")
    assert (dest / "model.safetensors").is_file()
    with pytest.raises(DataError, match=r"--check compares with transformers, which is not installed: pip install"):
        export_hf(source, tmp_path / "hf2", check=True)
    assert leftovers(tmp_path) == [] and not (tmp_path / "hf2").exists()


def test_the_core_imports_without_transformers() -> None:
    modules = "olmo_train.convert.hf_convert, olmo_train.convert.hf_check, cli.export_hf, cli.import_hf"
    code = f"import sys; sys.modules['transformers'] = None; import {modules}"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)


# ---- bad input: a message that says what to do, and no destination or .tmp- left ---------------------------


def refused(call: Any, match: str, parent: Path, dest: Path) -> None:
    with pytest.raises(DataError, match=match):
        call()
    assert not dest.exists() and leftovers(parent) == []


def test_bad_checkpoints_are_refused(exported: dict[str, tuple[Path, Path]], tokens: str, tmp_path: Path) -> None:
    source, _ = exported["olmo2"]
    dest = tmp_path / "hf"
    no_config = tmp_path / "run" / "step1"
    shutil.copytree(source, no_config)
    (no_config / "config.yaml").unlink()
    refused(lambda: export_hf(no_config, dest), r"no config\.yaml in the checkpoint or its save folder", tmp_path, dest)

    incomplete = tmp_path / "incomplete"
    shutil.copytree(source, incomplete)
    (incomplete / "trainer_state.json").unlink()
    refused(lambda: export_hf(incomplete, dest), r"not a complete checkpoint \(no trainer_state\.json", tmp_path, dest)

    dest.mkdir()
    with pytest.raises(DataError, match=r"hf: the destination exists; remove it or give another --destination"):
        export_hf(source, dest)
    assert leftovers(tmp_path) == [] and list(dest.iterdir()) == []
    dest.rmdir()

    odd = save_checkpoint(tmp_path / "odd", model_config(attention_layer_norm=False), [tokens], sharded=False)
    match = r"model\.norm_after=true, model\.attention_layer_norm=false has no transformers equivalent"
    refused(lambda: export_hf(odd, dest), match, tmp_path, dest)

    small = save_checkpoint(tmp_path / "small", model_config(vocab_size=1024), [tokens], sharded=False)
    match = r"the tokenizer has 2048 tokens, but the model's embedding has only 1024 rows \(model\.vocab_size\)"
    refused(lambda: export_hf(small, dest), match, tmp_path, dest)
    refused(lambda: export_hf(source, dest, dtype="float16"), r"--dtype 'float16': expected one of", tmp_path, dest)


def test_a_tokenizer_other_than_the_manifests_needs_force(
    exported: dict[str, tuple[Path, Path]], demo_tokenizer: str, tmp_path: Path
) -> None:
    source, _ = exported["olmo2-padded"]
    other = tmp_path / "other" / "tokenizer.json"
    other.parent.mkdir()
    other.write_text(json.dumps(json.loads(Path(demo_tokenizer).read_text()), indent=1))  # same vocab, other bytes
    dest = tmp_path / "hf"
    match = r"tokenizer\.json: sha256 \w+ differs from \w+, the tokenizer .* that the run's data manifest records; "
    match += r".*Pass --force to export with it anyway"
    refused(lambda: export_hf(source, dest, tokenizer=str(other)), match, tmp_path, dest)
    export_hf(source, dest, tokenizer=str(other), force=True)
    assert (dest / "tokenizer.json").read_bytes() == other.read_bytes()
    same = export_hf(source, tmp_path / "same", tokenizer=demo_tokenizer)  # the manifest's: no force needed
    assert (same / "tokenizer.json").read_bytes() == Path(demo_tokenizer).read_bytes()


def test_bad_transformers_models_are_refused(exported: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    _, good = exported["llama-gqa"]
    dest = tmp_path / "imported"

    def variant(name: str, **changes: Any) -> str:
        directory = tmp_path / name
        shutil.copytree(good, directory)
        config = json.loads((directory / "config.json").read_text())
        config.update(changes)
        (directory / "config.json").write_text(json.dumps(config))
        return str(directory)

    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2}))
    cases = {
        str(gpt2): r"model_type 'gpt2' is not supported; import takes olmo2, olmo3, llama, olmo",
        variant("gelu", hidden_act="gelu"): r"hidden_act is 'gelu'; only 'silu' is supported",
        variant("bias", attention_bias=True): r"attention_bias is True; only False is supported",
        variant("mlp-bias", mlp_bias=True): r"mlp_bias is True; only False is supported",
        variant("scaled", rope_scaling={"rope_type": "linear", "factor": 2.0}): r"rope_scaling has rope_type 'linear'",
        variant("head-dim", head_dim=32): r"head_dim 32 with hidden_size 64 and num_attention_heads 4",
        variant("small-vocab", vocab_size=1024): r"2048 tokens, but the model's embedding has 1024 rows",
        variant("fewer-layers", num_hidden_layers=2): r"does not account for, e\.g\. \['model\.layers\.2\.",
        # a 0 used to read as "absent", importing a GQA model as one without (issue 27)
        variant("no-kv-heads", num_key_value_heads=0): r"num_key_value_heads is 0; it must be a positive number",
        variant("no-layers", num_hidden_layers=-1): r"num_hidden_layers is -1; it must be a positive number",
        variant("no-heads", num_attention_heads=0): r"num_attention_heads is 0; it must be a positive number",
        variant("neg-width", hidden_size=-64): r"hidden_size is -64; it must be a positive number",
        variant("half-layer", num_hidden_layers=2.5): r"num_hidden_layers is 2.5; expected a int",
        variant("text-eps", rms_norm_eps="abc"): r"rms_norm_eps is 'abc'; expected a float",
        variant("quoted-eps", rms_norm_eps="1e-6"): r"rms_norm_eps is '1e-6'; expected a float",
        variant(
            "nan-theta", rope_parameters={"rope_type": "default", "rope_theta": float("nan")}
        ): r"rope_theta is nan",
        variant("text-dropout", attention_dropout="x"): r"attention_dropout is 'x'; expected a number",
        str(tmp_path / "nothing" / "here"): r"no such model directory",
    }
    for model, match in cases.items():
        refused(lambda model=model: import_hf(model, dest), match, tmp_path, dest)

    corrupt = Path(variant("corrupt"))
    weights = corrupt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    match = r"corrupt/model\.safetensors: not a readable safetensors file .* corrupt or was truncated"
    refused(lambda: import_hf(str(corrupt), dest), match, tmp_path, dest)
    (corrupt / "model.safetensors").unlink()
    refused(lambda: import_hf(str(corrupt), dest), r"neither model\.safetensors nor", tmp_path, dest)

    untied = Path(variant("untied-without-head"))
    from safetensors.torch import load_file, save_file

    w = load_file(untied / "model.safetensors")
    del w["lm_head.weight"]
    save_file(w, untied / "model.safetensors")
    refused(
        lambda: import_hf(str(untied), dest), r"missing 1 tensors the config implies, e\.g\. \['lm_head", tmp_path, dest
    )


def test_a_hub_id_offline_fails_fast(tmp_path: Path) -> None:
    t0 = time.perf_counter()
    with pytest.raises(DataError, match=r"no-such-owner/no-such-model: no such directory, and the Hugging Face hub"):
        import_hf("no-such-owner/no-such-model", tmp_path / "x")
    assert time.perf_counter() - t0 < 60
    assert list(tmp_path.iterdir()) == []


def test_imported_config_trains_only_with_data(exported: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """The config.yaml of an import is a complete training config that only lacks data."""
    _, hf_dir = exported["olmo2"]
    dest = import_hf(str(hf_dir), tmp_path / "imported")
    raw = yaml.safe_load((dest / "config.yaml").read_text())
    assert raw["data"]["paths"] == [] and raw["model"]["d_model"] == 64
    with pytest.raises(DataError, match=r"no training data; set data\.paths"):
        load_config(dest / "config.yaml")
    assert load_config(dest / "config.yaml", ["--data.paths=[x.npy]"]).model.n_layers == 3
