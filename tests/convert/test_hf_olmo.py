"""ai2-olmo's `hf_olmo` directories (DataDecide's format) in, and out to transformers' own model types: tiny random
models built and saved by ai2-olmo 0.6.0's own `hf_olmo` classes (OLMo-1-style and OLMo-2-style blocks, tied and
untied, grouped blocks, safetensors and pytorch_model.bin), run in the environment of its own that
scripts/ai2_olmo_env.sh makes (its `olmo_data` package clashes with ours): our import gives their logits, and so
does plain transformers (no ai2-olmo) loading our export-hf of the import; every config key we cannot compute is
refused naming it, as ai2-olmo itself writes it. The file-level cases (refusals, .bin read as tensors only,
names) run without that environment, on directories written here."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from olmo_data.config import ModelConfig
from olmo_data.config.olmo import OLMO_DEFAULTS
from olmo_data.errors import DataError
from olmo_train.convert import export_hf, import_hf
from olmo_train.convert.hf_olmo import read_hf_olmo
from olmo_train.convert.olmo_native import to_olmo_state
from olmo_train.nn import Transformer

REPO = Path(__file__).resolve().parents[2]
REFERENCE = Path(__file__).with_name("hf_olmo_reference.py")
ENV = Path(os.environ.get("AI2_OLMO_ENV", REPO / ".venv-refs" / "ai2-olmo"))
VOCAB, ROWS = 2048, 2112  # the demo tokenizer's vocabulary; OLMo pads the embedding to a multiple of 64
IDS = [[3, 17, 1000, 2047, 5, 9, 64, 1999, 12, 700, 31, 8, 1024, 77, 2, 450], list(range(100, 1700, 100))]

_SHAPE = {
    "d_model": 64,
    "n_heads": 4,
    "n_layers": 2,
    "vocab_size": VOCAB,
    "embedding_size": ROWS,
    "max_sequence_length": 64,
    "rope": True,
    "include_bias": False,
    "eos_token_id": 0,
    "pad_token_id": 1,
    "attention_dropout": 0.0,
    "residual_dropout": 0.0,
    "embedding_dropout": 0.0,
}
# OLMo-1 (OLMo-1B/7B): LayerNorm without weights, pre-norm, no QK-norm, tied embedding
OLMO1 = {
    **_SHAPE,
    "layer_norm_type": "default",
    "layer_norm_with_affine": False,
    "attention_layer_norm": False,
    "norm_after": False,
    "weight_tying": True,
    "mlp_hidden_size": 256,
    "layer_norm_eps": 1e-5,
}
# OLMo-2 (and DataDecide): RMSNorm of each sublayer's output, QK-norm; GQA here; DataDecide-like run keys
OLMO2 = {
    **_SHAPE,
    "layer_norm_type": "rms",
    "layer_norm_with_affine": True,
    "attention_layer_norm": True,
    "norm_after": True,
    "weight_tying": False,
    "n_kv_heads": 2,
    "mlp_ratio": 6,
    "layer_norm_eps": 1e-6,
    "rope_theta": 500_000,
    "flash_attention": True,
    "precision": "amp_bf16",
    "init_cutoff_factor": 3.0,
}
# name -> (config, saved as pytorch_model.bin, the transformers type export-hf writes)
CASES: dict[str, tuple[dict[str, Any], bool, str]] = {
    "olmo1-tied": (OLMO1, False, "olmo"),
    "olmo1-untied-grouped-bin": (
        {**OLMO1, "weight_tying": False, "block_group_size": 2, "layer_norm_type": "low_precision"},
        True,
        "olmo",
    ),
    "olmo2-gqa": (OLMO2, False, "olmo2"),
}
# name -> (config, the one line of the refusal); each is ai2-olmo's own config.json, as its OLMoConfig writes it
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "clip_qkv": ({**OLMO1, "clip_qkv": 8.0}, "clip_qkv is 8.0; only null can be imported"),
    "alibi": ({**OLMO1, "alibi": True, "rope": False}, "alibi is true; only false can be imported"),
    "no-rope": ({**OLMO1, "rope": False}, "rope is false; only true can be imported"),
    "include_bias": ({**OLMO1, "include_bias": True}, "include_bias is true; only false can be imported"),
    "bias_for_layer_norm": (
        {**OLMO2, "bias_for_layer_norm": True},
        "bias_for_layer_norm is true; only null or false can be imported",
    ),
    "llama-block": (  # without GQA: ai2-olmo's own llama block has none (its k_proj is d_model wide)
        {**OLMO2, "block_type": "llama", "n_kv_heads": None},
        'block_type is "llama"; only "sequential" can be imported',
    ),
    "scale_logits": ({**OLMO2, "scale_logits": True}, "scale_logits is true; only false can be imported"),
    "gelu": ({**OLMO1, "activation_type": "gelu"}, 'activation_type is "gelu"; only "swiglu" can be imported'),
    "embedding_layer_norm": (
        {**OLMO2, "embedding_layer_norm": True},
        "embedding_layer_norm is true; only false can be imported",
    ),
    "qk-norm-without-affine": (
        {**OLMO2, "attention_layer_norm_with_affine": False},
        "attention_layer_norm_with_affine is false; only true can be imported",
    ),
}


def max_diff(a: Any, b: Any) -> float:
    return float((torch.as_tensor(a).float() - torch.as_tensor(b).float()).abs().max())


def our_logits(model: ModelConfig, state: dict[str, torch.Tensor]) -> torch.Tensor:
    ours = Transformer(model).eval()
    ours.load_state_dict(state)
    with torch.no_grad():
        return ours(torch.tensor(IDS))


# ---- directories written by ai2-olmo itself ----------------------------------------------------------------


def _skip_reason() -> str:
    failed = ENV.with_name(ENV.name + ".failed")
    why = failed.read_text().strip() if failed.is_file() else "it has not been made"
    return f"no ai2-olmo reference environment at {ENV} ({why}): run `bash scripts/ai2_olmo_env.sh`"


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every case's directory and logits, written by ai2-olmo's hf_olmo in its own environment (one run)."""
    python = ENV / "bin" / "python"
    if not (ENV / ".installed").is_file() or not python.is_file():
        pytest.skip(_skip_reason())
    out = tmp_path_factory.mktemp("hf_olmo")
    cases = {n: {"config": c, "bin": b} for n, (c, b, _) in CASES.items()}
    cases.update({n: {"config": c} for n, (c, _) in REFUSED.items()})
    (out / "cases.json").write_text(json.dumps({"ids": IDS, "cases": cases}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    # -I: neither the working directory nor PYTHONPATH on its path, so our olmo_data never shadows ai2-olmo's
    run = subprocess.run(
        [str(python), "-I", str(REFERENCE), str(out / "cases.json"), str(out)],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, f"the ai2-olmo reference run failed:\n{run.stderr[-3000:]}"
    return out


@pytest.mark.parametrize("name", CASES)
def test_import_gives_ai2_olmos_logits(reference: Path, name: str) -> None:
    source = reference / name
    written = sorted(p.name for p in source.iterdir())
    assert ("pytorch_model.bin" in written) == CASES[name][1], written  # each case is read from its own kind
    config = json.loads((source / "config.json").read_text())
    assert config["model_type"] == "hf_olmo" and config["architectures"] == ["OLMoForCausalLM"]
    model, state = read_hf_olmo(source)
    assert (model.vocab_size, model.embedding_size, model.weight_tying) == (VOCAB, ROWS, CASES[name][0]["weight_tying"])
    assert max_diff(our_logits(model, state), np.load(reference / f"{name}.npy")) <= 1e-4


@pytest.mark.parametrize("name", CASES)
def test_export_loads_in_plain_transformers(reference: Path, name: str, tmp_path: Path, demo_tokenizer: str) -> None:
    """import (as import-hf writes it), export-hf, then AutoModelForCausalLM in this environment, which has no
    ai2-olmo: the same logits as ai2-olmo's model, as a model type transformers registers."""
    transformers = pytest.importorskip("transformers")
    source = tmp_path / "source"
    shutil.copytree(reference / name, source)
    shutil.copyfile(demo_tokenizer, source / "tokenizer.json")  # as a DataDecide directory ships its tokenizer
    with pytest.raises(DataError, match=r"--check loads the source with transformers, which has no hf_olmo"):
        import_hf(str(source), tmp_path / "checked", check=True)
    import_hf(str(source), tmp_path / "ours")  # what `olmo-train import-hf DIR` runs
    export_hf(tmp_path / "ours", tmp_path / "hf", check=True)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == CASES[name][2] and "auto_map" not in config
    assert importlib.util.find_spec("hf_olmo") is None  # plain transformers: nothing registers hf_olmo here
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    with torch.no_grad():
        got = hf(input_ids=torch.tensor(IDS)).logits
    assert max_diff(got, np.load(reference / f"{name}.npy")) <= 1e-4


@pytest.mark.parametrize("name", REFUSED)
def test_ai2_olmos_options_we_cannot_compute_are_refused_by_key(reference: Path, name: str) -> None:
    config, message = REFUSED[name]
    source = reference / name
    with pytest.raises(DataError) as info:
        read_hf_olmo(source)
    assert str(info.value) == f"{source / 'config.json'}: {message} ({_why(name)})"
    assert "\n" not in str(info.value)


def _why(name: str) -> str:
    from olmo_data.config.olmo.model_keys import REQUIRED

    key = {"no-rope": "rope", "llama-block": "block_type", "gelu": "activation_type"}.get(name, name)
    if key == "qk-norm-without-affine":
        return "our QK-norm has a learned scale"
    return next(why for k, _, why in REQUIRED if k == key)


# ---- directories written here (no ai2-olmo needed) ---------------------------------------------------------


def _hf_olmo_dir(
    tmp_path: Path, overrides: dict[str, Any] | None = None, *, bin: bool = False
) -> tuple[Path, dict[str, torch.Tensor]]:
    """An hf_olmo directory as ai2-olmo writes one: every OLMo key, transformers' bookkeeping, and a random model's
    OLMo state dict under `model.`; returns it and our state dict of the same weights."""
    config = {**OLMO_DEFAULTS, **OLMO2, **(overrides or {})}
    config.update(model_type="hf_olmo", architectures=["OLMoForCausalLM"], transformers_version="4.46.3")
    config.update(torch_dtype="float32", use_cache=False, _attn_implementation_autoset=True, auto_map={"a": "b"})
    directory = tmp_path / "hf_olmo"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    model = ModelConfig(
        d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, mlp_hidden_size=192, vocab_size=VOCAB, embedding_size=ROWS
    )
    torch.manual_seed(0)
    ours = Transformer(model).state_dict()
    theirs = {f"model.{k}": v.clone() for k, v in to_olmo_state(ours, model).items()}
    if bin:
        torch.save(theirs, directory / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file(theirs, str(directory / "model.safetensors"))
    return directory, ours


@pytest.mark.parametrize("bin", [False, True])
def test_the_same_tensors_from_safetensors_and_bin(tmp_path: Path, bin: bool) -> None:
    directory, ours = _hf_olmo_dir(tmp_path, bin=bin)
    model, state = read_hf_olmo(directory)
    assert (model.n_kv_heads, model.mlp_hidden_size, model.layer_norm_eps, model.rope_theta) == (2, 192, 1e-6, 5e5)
    assert list(state) == list(ours) and all(torch.equal(state[k], ours[k]) for k in ours)


def test_the_same_tensors_from_a_sharded_bin(tmp_path: Path) -> None:
    """pytorch_model.bin.index.json and its shards, read through the same sharded reader safetensors use."""
    directory, ours = _hf_olmo_dir(tmp_path, bin=True)
    whole = torch.load(directory / "pytorch_model.bin", weights_only=True)
    (directory / "pytorch_model.bin").unlink()
    names = list(whole)
    shards = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
    for file, keys in shards.items():
        torch.save({k: whole[k] for k in keys}, directory / file)
    weight_map = {k: file for file, keys in shards.items() for k in keys}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    _, state = read_hf_olmo(directory)
    assert sorted(state) == sorted(ours) and all(torch.equal(state[k], ours[k]) for k in ours)
    weight_map["extra.weight"] = "pytorch_model-00001-of-00002.bin"
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(DataError, match=r"index\.json: names tensors its shards do not hold, e\.g\. \['extra"):
        read_hf_olmo(directory)


class _Payload:
    """Unpickling this would run code of the file's choosing; a weights-only load refuses it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo unpickled > /dev/null",))


def test_a_bin_that_holds_more_than_tensors_is_refused_unread(tmp_path: Path) -> None:
    directory, _ = _hf_olmo_dir(tmp_path, bin=True)
    state = torch.load(directory / "pytorch_model.bin", weights_only=True)
    torch.save({**state, "payload": _Payload()}, directory / "pytorch_model.bin")
    with pytest.raises(DataError) as info:
        read_hf_olmo(directory)
    assert str(info.value) == (
        f"{directory / 'pytorch_model.bin'}: holds objects other than tensors (Trying to load unsupported GLOBAL "
        "posix.system whose module posix is blocked.); it is not unpickled (that would run code the file names): "
        "convert it to safetensors from a copy you trust"
    )


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"clip_qkv": 8}, "clip_qkv is 8; only null can be imported (our attention does not clip q, k and v)"),
        ({"some_new_option": 3}, "some_new_option is 3, an OLMo option this import does not know"),
        ({"rope_scaling": {"factor": 2.0}}, "rope_scaling is {'factor': 2.0}, an OLMo option this import does not"),
        ({"d_model": "64"}, 'd_model is "64"; expected a int'),
        ({"n_heads": 3, "n_kv_heads": None}, "d_model 64 must be n_heads 3 heads of an even size"),
        ({"layer_norm_type": "fancy"}, 'model.layer_norm_type is "fancy"; OLMo\'s kinds are default, low_precision'),
    ],
)
def test_a_config_key_is_refused_in_one_line_naming_it(tmp_path: Path, overrides: dict[str, Any], message: str) -> None:
    directory, _ = _hf_olmo_dir(tmp_path, overrides)
    with pytest.raises(DataError) as info:
        read_hf_olmo(directory)
    assert str(info.value).startswith(f"{directory / 'config.json'}: {message}") and "\n" not in str(info.value)


def test_weights_under_other_names_are_refused(tmp_path: Path) -> None:
    directory, ours = _hf_olmo_dir(tmp_path)
    from safetensors.torch import save_file

    save_file(to_olmo_state(ours, read_hf_olmo(directory)[0]), str(directory / "model.safetensors"))  # no `model.`
    with pytest.raises(DataError, match=r"model\.safetensors: tensor transformer\.\S+ is not under 'model\.'"):
        read_hf_olmo(directory)


def test_not_an_hf_olmo_directory(tmp_path: Path) -> None:
    directory, _ = _hf_olmo_dir(tmp_path)
    (directory / "model.safetensors").unlink()
    with pytest.raises(DataError, match=r"hf_olmo: no weights \(model\.safetensors, "):
        read_hf_olmo(directory)
    (directory / "config.json").write_text(json.dumps({"model_type": "olmo2"}))
    with pytest.raises(DataError, match=r"config\.json: model_type is 'olmo2', not 'hf_olmo'"):
        read_hf_olmo(directory)
