"""OLMo's own checkpoints in, and OLMo-1 models through training and `transformers`: a random transformers OLMo-2
or OLMo-1 model written out by hand in OLMo's native layout (model.pt + config.yaml) comes back from `import-olmo`
then `export-hf` with the very same tensors and logits; the written layout is checked against OLMo's own forward
(rewritten here from olmo/model.py), so a table and a helper that agreed on a wrong order would still fail; OLMo-1
trains with the new norm options; `olmo` goes through export-hf and import-hf; unsupported OLMo options are refused
by their config key."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_data.config import ModelConfig
from olmo_data.errors import DataError
from olmo_train.checkpoint.files import write_imported
from olmo_train.convert import expected_hf_names, export_hf, hf_config, import_hf, import_olmo, load_model
from olmo_train.convert.olmo_native import olmo_model_section, to_olmo_state
from olmo_train.nn import Transformer

transformers = pytest.importorskip("transformers")

REPO = Path(__file__).resolve().parents[2]
VOCAB, ROWS, SEQ = 2048, 2112, 64  # the demo tokenizer's vocabulary; OLMo pads the embedding to a multiple of 64


# ---- a random transformers model, written out as OLMo's trainer writes its checkpoints -------------------------


def randomize(model: Any, seed: int) -> Any:
    """Every tensor random and of order 1, norm scales too (at transformers' init they are all 1, and a norm mapped
    to the wrong place would go unseen)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.15 * noise)
    return model.eval()


def olmo2_model(seed: int = 0) -> Any:
    config = transformers.Olmo2Config(
        vocab_size=ROWS,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        rope_theta=500_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        pad_token_id=1,
        eos_token_id=0,
    )
    return randomize(transformers.Olmo2ForCausalLM(config), seed)


def olmo1_model(seed: int = 1, *, tied: bool = True, kv_heads: int = 4) -> Any:
    config = transformers.OlmoConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=SEQ,
        rope_theta=10_000.0,
        tie_word_embeddings=tied,
        pad_token_id=1,
        eos_token_id=0,
    )
    return randomize(transformers.OlmoForCausalLM(config), seed)


def olmo_state_of(hf: Any) -> dict[str, torch.Tensor]:
    """OLMo's model.pt for a transformers OLMo model, by hand from OLMo's modules: att_proj is q, k, v stacked;
    ff_proj is what OLMo's SwiGLU chunks into (x, gate), so up first; attn_norm/ff_norm are OLMo-2's norms of the
    sublayer outputs; OLMo-1's LayerNorms have no weights; a tied model has no transformer.ff_out."""
    sd = {k: v.clone() for k, v in hf.state_dict().items()}
    out = {"transformer.wte.weight": sd["model.embed_tokens.weight"]}
    for i in range(hf.config.num_hidden_layers):
        theirs, ours = f"model.layers.{i}.", f"transformer.blocks.{i}."
        attn = [sd[f"{theirs}self_attn.{p}_proj.weight"] for p in "qkv"]
        out[f"{ours}att_proj.weight"] = torch.cat(attn)
        out[f"{ours}attn_out.weight"] = sd[f"{theirs}self_attn.o_proj.weight"]
        out[f"{ours}ff_proj.weight"] = torch.cat(
            [sd[f"{theirs}mlp.up_proj.weight"], sd[f"{theirs}mlp.gate_proj.weight"]]
        )
        out[f"{ours}ff_out.weight"] = sd[f"{theirs}mlp.down_proj.weight"]
        if hf.config.model_type == "olmo2":
            out[f"{ours}q_norm.weight"] = sd[f"{theirs}self_attn.q_norm.weight"]
            out[f"{ours}k_norm.weight"] = sd[f"{theirs}self_attn.k_norm.weight"]
            out[f"{ours}attn_norm.weight"] = sd[f"{theirs}post_attention_layernorm.weight"]
            out[f"{ours}ff_norm.weight"] = sd[f"{theirs}post_feedforward_layernorm.weight"]
    if hf.config.model_type == "olmo2":
        out["transformer.ln_f.weight"] = sd["model.norm.weight"]
    if not hf.config.tie_word_embeddings:
        out["transformer.ff_out.weight"] = sd["lm_head.weight"]
    return out


def olmo2_section() -> dict[str, Any]:
    """As configs/official-1124/OLMo2-7B-stage1.yaml states it (every key explicit), at a tiny size."""
    return {
        "d_model": 64,
        "n_heads": 4,
        "n_kv_heads": 2,
        "n_layers": 2,
        "mlp_hidden_size": 192,  # ff_proj's width: up and gate, 96 each
        "weight_tying": False,
        "alibi": False,
        "rope": True,
        "rope_theta": 500000,
        "flash_attention": True,
        "attention_dropout": 0.0,
        "include_bias": False,
        "block_type": "sequential",
        "layer_norm_type": "rms",
        "layer_norm_with_affine": True,
        "layer_norm_eps": "1e-6",  # PyYAML reads OLMo's unquoted 1e-6 as a string
        "bias_for_layer_norm": False,
        "attention_layer_norm": True,
        "attention_layer_norm_with_affine": True,
        "norm_after": True,
        "activation_type": "swiglu",
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "max_sequence_length": SEQ,
        "vocab_size": VOCAB,
        "embedding_size": ROWS,
        "eos_token_id": 3,  # not the tokenizer's own (0): the export must take OLMo's
        "pad_token_id": 1,
        "init_device": "meta",
        "init_fn": "normal",
        "init_std": 0.02,
        "init_cutoff_factor": 3,
    }


def olmo1_section(**changes: Any) -> dict[str, Any]:
    """As configs/official-0724/OLMo-1B.yaml states it: mlp_ratio, and no rope_theta or layer_norm_eps (OLMo's
    defaults, 10000 and 1e-5, apply)."""
    section = {
        "d_model": 64,
        "n_heads": 4,
        "n_layers": 2,
        "mlp_ratio": 4,
        "weight_tying": True,
        "alibi": False,
        "rope": True,
        "flash_attention": False,
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "multi_query_attention": False,
        "include_bias": False,
        "block_type": "sequential",
        "layer_norm_type": "default",
        "layer_norm_with_affine": False,
        "bias_for_layer_norm": False,
        "attention_layer_norm_with_affine": False,
        "activation_type": "swiglu",
        "residual_dropout": 0.0,
        "embedding_dropout": 0.0,
        "max_sequence_length": SEQ,
        "vocab_size": VOCAB,
        "embedding_size": VOCAB,
        "eos_token_id": 0,
        "pad_token_id": 1,
        "init_device": "meta",
        "init_fn": "mitchell",
    }
    section.update(changes)
    return {k: v for k, v in section.items() if v is not None}


def write_olmo(directory: Path, state: dict[str, torch.Tensor], section: dict[str, Any]) -> Path:
    """An OLMo stepN-unsharded directory: model.pt and the run's whole config.yaml."""
    directory.mkdir(parents=True)
    torch.save(state, directory / "model.pt")
    config = {
        "run_name": "tiny-olmo",
        "seed": 6198,
        "model": section,
        "optimizer": {"name": "adamw", "learning_rate": 4e-4},
        "tokenizer": {"identifier": "tokenizers/allenai_dolma2.json", "truncate_direction": "right"},
        "max_duration": "1ep",
    }
    (directory / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return directory


def olmo_logits(state: dict[str, torch.Tensor], section: dict[str, Any], ids: torch.Tensor) -> torch.Tensor:
    """OLMo's forward (OLMo.forward with OLMoSequentialBlock, olmo/model.py) on its own state dict, for the options
    these tests use: fused q|k|v, SwiGLU `x, gate = ff_proj(h).chunk(2); silu(gate) * x`, norm before each sublayer
    or (norm_after) of its output, QK-norm over the whole projection, RoPE on the rotate-half layout."""
    m = {"norm_after": False, **section}  # OLMo's default where OLMo-1B's config leaves it out
    d, heads, layers = m["d_model"], m["n_heads"], m["n_layers"]
    kv = m.get("n_kv_heads") or (1 if m.get("multi_query_attention") else heads)
    hd, eps = d // heads, float(m.get("layer_norm_eps", 1e-5))

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        weight = state.get(f"{name}.weight")
        if m["layer_norm_type"] == "rms":
            y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        else:
            y = F.layer_norm(x, (x.shape[-1],), None, None, eps)
        return y * weight if weight is not None else y

    B, T = ids.shape
    inv_freq = 1.0 / (m.get("rope_theta", 10_000) ** (torch.arange(0, hd, 2, dtype=torch.float) / hd))
    angles = torch.outer(torch.arange(T, dtype=torch.float), inv_freq)
    angles = torch.cat([angles, angles], -1)

    def rope(t: torch.Tensor) -> torch.Tensor:
        x1, x2 = t.chunk(2, -1)
        return t * angles.cos() + torch.cat([-x2, x1], -1) * angles.sin()

    x = F.embedding(ids, state["transformer.wte.weight"])
    for i in range(layers):
        b = f"transformer.blocks.{i}"
        h = x if m["norm_after"] else norm(x, f"{b}.attn_norm")
        q, k, v = (h @ state[f"{b}.att_proj.weight"].T).split([d, kv * hd, kv * hd], -1)
        if m["attention_layer_norm"]:
            q, k = norm(q, f"{b}.q_norm"), norm(k, f"{b}.k_norm")
        q = q.view(B, T, heads, hd).transpose(1, 2)
        k, v = (t.view(B, T, kv, hd).transpose(1, 2).repeat_interleave(heads // kv, 1) for t in (k, v))
        att = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True).transpose(1, 2).reshape(B, T, d)
        att = att @ state[f"{b}.attn_out.weight"].T
        x = x + (norm(att, f"{b}.attn_norm") if m["norm_after"] else att)
        h = x if m["norm_after"] else norm(x, f"{b}.ff_norm")
        up, gate = (h @ state[f"{b}.ff_proj.weight"].T).chunk(2, -1)
        out = (F.silu(gate) * up) @ state[f"{b}.ff_out.weight"].T
        x = x + (norm(out, f"{b}.ff_norm") if m["norm_after"] else out)
    x = norm(x, "transformer.ln_f")
    head = state["transformer.wte.weight"] if m["weight_tying"] else state["transformer.ff_out.weight"]
    return x @ head.T


def probe(n: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, n, (2, SEQ), generator=torch.Generator().manual_seed(5))


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def group_blocks(state: dict[str, torch.Tensor], size: int) -> dict[str, torch.Tensor]:
    """The names OLMo writes with block_group_size > 1: transformer.block_groups.G.J for block G * size + J."""
    out = {}
    for key, tensor in state.items():
        parts = key.split(".")
        if parts[1] == "blocks":
            i = int(parts[2])
            key = ".".join(["transformer", "block_groups", str(i // size), str(i % size), *parts[3:]])
        out[key] = tensor
    return out


CASES: dict[str, Any] = {
    # OLMo-2 (reordered RMSNorm, QK-norm), GQA, untied, embedding padded past the vocabulary, shipped with a tokenizer
    "olmo2-gqa-padded": lambda: (olmo2_model(), olmo2_section()),
    # OLMo-1B's shape: LayerNorm without weights, tied, mlp_ratio, OLMo's default rope_theta and eps
    "olmo1-tied": lambda: (olmo1_model(), olmo1_section()),
    # OLMo-1 with the older multi_query_attention flag (one key/value head), untied, blocks written in groups of 2
    "olmo1-mqa-grouped": lambda: (
        olmo1_model(seed=2, tied=False, kv_heads=1),
        olmo1_section(
            weight_tying=False, multi_query_attention=True, mlp_ratio=None, mlp_hidden_size=256, block_group_size=2
        ),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_olmo_checkpoint_round_trips_through_import_olmo_and_export_hf(
    case: str, tmp_path: Path, demo_tokenizer: str
) -> None:
    hf, section = CASES[case]()
    ids = probe()
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
    olmo_state = olmo_state_of(hf)
    # the hand-written layout is OLMo's: OLMo's forward on it computes the transformers model
    assert max_diff(olmo_logits(olmo_state, section, ids), expected) <= 1e-5
    if section.get("block_group_size"):
        olmo_state = group_blocks(olmo_state, section["block_group_size"])
    source = write_olmo(tmp_path / "step1000-unsharded", olmo_state, section)

    runner = CliRunner()
    with_tokenizer = ["-t", demo_tokenizer] if case.startswith("olmo2") else []
    result = runner.invoke(
        olmo_train_cli, ["import-olmo", str(source), "--destination", str(tmp_path / "ours"), *with_tokenizer]
    )
    assert result.exit_code == 0, result.output
    assert "2 layers, d_model 64" in result.stdout and "--load_path=" in result.stdout
    assert ("with tokenizer" in result.stdout) is bool(with_tokenizer)
    ours, _ = load_model(tmp_path / "ours")
    direct, _ = load_model(source)  # OLMo's directory itself, without an import
    with torch.no_grad():
        assert max_diff(ours(ids), expected) <= 1e-5 and max_diff(direct(ids), expected) <= 1e-5

    result = runner.invoke(olmo_train_cli, ["export-hf", str(tmp_path / "ours"), "--destination", str(tmp_path / "hf")])
    assert result.exit_code == 0, result.output
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["model_type"] == hf.config.model_type and config["architectures"] == [type(hf).__name__]
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    original, exported = hf.state_dict(), back.state_dict()
    assert set(exported) == set(original)
    for key, tensor in original.items():
        assert exported[key].dtype == torch.float32 and torch.equal(exported[key], tensor), key
    with torch.no_grad():
        got = back(input_ids=ids).logits
    print(f"{case}: max abs logit difference {max_diff(got, expected):.3g}")
    assert got.dtype == torch.float32 and max_diff(got, expected) <= 1e-5
    if with_tokenizer:  # OLMo's config states eos and pad; they travel with the tokenizer
        assert (config["eos_token_id"], config["pad_token_id"], config["bos_token_id"]) == (3, 1, None)
        assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == Path(demo_tokenizer).read_bytes()


def test_the_imported_model_config_and_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    hf, section = CASES["olmo1-tied"]()
    monkeypatch.setenv("OLMO_PROGRESS", "1")  # the stages' bar, as a terminal shows it
    dest = import_olmo(str(write_olmo(tmp_path / "olmo", olmo_state_of(hf), section)), tmp_path / "ours")
    bar = capsys.readouterr().err
    assert "import-olmo: 0/2, reading [" in bar and "import-olmo: 2/2, writing [" in bar, bar
    raw = yaml.safe_load((dest / "config.yaml").read_text())
    model = raw["model"]
    assert (model["layer_norm_type"], model["layer_norm_with_affine"], model["layer_norm_eps"]) == (
        "layer_norm",
        False,
        1e-5,
    )
    assert (model["attention_layer_norm"], model["norm_after"], model["weight_tying"]) == (False, False, True)
    assert (model["mlp_hidden_size"], model["rope_theta"], model["embedding_size"]) == (128, 10_000.0, None)
    assert raw["load_path"] == str(dest.resolve()) and raw["reset_trainer_state"] is True
    state = torch.load(dest / "model.pt", weights_only=True)
    assert not [k for k in state if "norm" in k], "a model without affine norms has no norm weights"
    assert state["lm_head.weight"].data_ptr() == state["embeddings.weight"].data_ptr()
    assert json.loads((dest / "trainer_state.json").read_text())["step"] == 0
    assert sorted(json.loads((dest / "checksums.json").read_text())["files"]) == [
        "config.yaml",
        "model.pt",
        "trainer_state.json",
    ]
    assert not (dest / "tokenizer.json").exists()


def test_ours_to_olmos_layout_and_back_is_bitwise(tmp_path: Path) -> None:
    """Both directions of the table and of the config fields, over the variants OLMo has and transformers lacks
    (LayerNorm with scales, pre-norm with QK-norm)."""
    shapes: dict[str, dict[str, Any]] = {
        "olmo2": {},
        "layer-norm-affine-gqa": {"layer_norm_type": "layer_norm", "n_kv_heads": 2, "norm_after": False},
        "rms-no-affine-tied-padded": {"layer_norm_with_affine": False, "weight_tying": True, "embedding_size": 80},
    }
    for name, shape in shapes.items():
        model = ModelConfig(d_model=32, n_heads=4, n_layers=2, vocab_size=64, max_sequence_length=16, **shape)
        torch.manual_seed(0)
        state = Transformer(model).state_dict()
        source = write_olmo(tmp_path / name, to_olmo_state(state, model), olmo_model_section(model))
        dest = import_olmo(str(source), tmp_path / f"{name}-ours")
        imported = torch.load(dest / "model.pt", weights_only=True)
        assert list(imported) == list(state)
        assert all(torch.equal(imported[k], v) for k, v in state.items()), name
        got = yaml.safe_load((dest / "config.yaml").read_text())["model"]
        want = {**model.__dict__, "n_kv_heads": model.n_kv_heads or 4, "mlp_hidden_size": 128}
        assert got == want, name


def test_load_model_and_import_olmo_from_a_url(
    tmp_path: Path, http_root: tuple[Path, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, url = http_root
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    hf, section = CASES["olmo1-tied"]()
    write_olmo(root / "step1000-unsharded", olmo_state_of(hf), section)
    ids = probe()
    with torch.no_grad():
        expected = hf(input_ids=ids).logits
        model, tokenizer = load_model(f"{url}/step1000-unsharded")
        assert max_diff(model(ids), expected) <= 1e-5 and tokenizer is None
    dest = import_olmo(f"{url}/step1000-unsharded/", tmp_path / "ours")
    with torch.no_grad():
        assert max_diff(load_model(dest)[0](ids), expected) <= 1e-5


def test_an_olmo_checkpoint_url_that_stalls_or_loops_fails_naming_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """OLMo's model.pt from a server that stalls mid-body: load_model and import-olmo fail after the configured
    timeout with one line naming the file's URL (before: cached-path waited as long as the server did), and no
    model.pt is left in the download cache; a redirect loop on its config is named as one."""
    import time

    from tests.flaky_server import Faults, FlakyServer

    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("OLMO_DATA_REMOTE_TIMEOUT_S", "0.3")
    monkeypatch.setenv("OLMO_DATA_REMOTE_ATTEMPTS", "2")
    monkeypatch.setattr("olmo_data.remote.reader._READER", None)  # the next reader reads the settings above
    hf, section = CASES["olmo1-tied"]()
    write_olmo(tmp_path / "www" / "step1000-unsharded", olmo_state_of(hf), section)
    with FlakyServer(tmp_path / "www", Faults(stall="model.pt")) as server:
        url = f"{server.url}/step1000-unsharded"
        began = time.monotonic()
        with pytest.raises(DataError) as e:
            load_model(url)
        assert time.monotonic() - began < 5
        assert str(e.value).startswith(f"{url}/model.pt: ranged read of bytes 0..") and "\n" not in str(e.value)
        assert "after 2 attempts" in str(e.value) and "no answer for 0.3 s" in str(e.value)
        with pytest.raises(DataError, match=re.escape(f"{url}/model.pt: ranged read of bytes 0..")):
            import_olmo(url, tmp_path / "ours")
        assert not (tmp_path / "ours").exists()
        assert not [p for p in (tmp_path / "cache").rglob("*") if "model.pt" in p.name]
        server.faults = Faults(redirect_loop="config.yaml")
        with pytest.raises(DataError, match=re.escape(f"{url}/config.yaml: size failed (too many redirects (5)")):
            load_model(url)


# ---- OLMo-1 through the trainer ----------------------------------------------------------------------------


def test_olmo1_trains_from_scratch_and_from_an_imported_checkpoint(tmp_path: Path) -> None:
    from olmo_data.run.batches import inspect_batch
    from olmo_train.train import main

    tokens = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, VOCAB, 12 * SEQ).astype(np.uint16).tofile(tokens)
    olmo1 = {"layer_norm_type": "layer_norm", "layer_norm_with_affine": False, "layer_norm_eps": 1e-5}
    olmo1 |= {"attention_layer_norm": False, "norm_after": False}
    scratch = {
        "save_folder": str(tmp_path / "scratch"),
        "max_duration": 2,
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "fsdp",
        "save_interval_unsharded": 2,
        "model": {"d_model": 32, "n_heads": 4, "n_layers": 2, "vocab_size": VOCAB, "max_sequence_length": SEQ, **olmo1},
        "data": {"paths": [str(tokens)]},
    }
    (tmp_path / "scratch.yaml").write_text(yaml.safe_dump(scratch))
    assert main([str(tmp_path / "scratch.yaml")]) == 0
    trained = torch.load(tmp_path / "scratch" / "step2-unsharded" / "model.pt", weights_only=True)
    assert not [k for k in trained if "norm" in k] and all(bool(t.isfinite().all()) for t in trained.values())
    losses = [json.loads(x)["train/loss"] for x in (tmp_path / "scratch" / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 2 and all(np.isfinite(losses))

    # fine-tuning an imported OLMo-1 model: the loss of step 1 is the imported weights' loss on batch 1
    hf, section = CASES["olmo1-tied"]()
    dest = import_olmo(str(write_olmo(tmp_path / "olmo", olmo_state_of(hf), section)), tmp_path / "ours")
    cfg = yaml.safe_load((dest / "config.yaml").read_text())
    cfg.update(
        save_folder=str(tmp_path / "finetune"),
        max_duration=1,
        global_train_batch_size=4,
        device_train_microbatch_size=4,
        distributed_strategy="single",
        data={"paths": [str(tokens)]},
    )
    (tmp_path / "finetune.yaml").write_text(yaml.safe_dump(cfg))
    assert main([str(tmp_path / "finetune.yaml")]) == 0
    logged = json.loads((tmp_path / "finetune" / "metrics.jsonl").read_text().splitlines()[0])["train/loss"]
    ids = torch.tensor(
        np.array([i.token_ids for i in inspect_batch(str(tmp_path / "finetune.yaml"), step=1).instances])
    )
    with torch.no_grad():
        logits = hf(input_ids=ids).logits[:, :-1]
    expected = float(F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)))
    assert logged == pytest.approx(expected, rel=1e-5)


@pytest.mark.slow
def test_olmo1_under_two_process_fsdp_trains_as_one_process(tmp_path: Path) -> None:
    """FSDP shards blocks whose norms have no parameters at all; the losses are those of one process."""
    tokens = tmp_path / "tokens.npy"
    np.random.default_rng(0).integers(0, 256, 40 * 32).astype(np.uint16).tofile(tokens)
    olmo1 = {"layer_norm_type": "layer_norm", "layer_norm_with_affine": False, "layer_norm_eps": 1e-5}
    model = {"d_model": 32, "n_heads": 2, "n_layers": 2, "vocab_size": 256, "max_sequence_length": 32, **olmo1}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    losses = {}
    for strategy, launcher in (
        ("fsdp", ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]),
        ("single", []),
    ):
        cfg = {
            "seed": 3,
            "save_folder": str(tmp_path / strategy),
            "max_duration": 3,
            "global_train_batch_size": 8,
            "device_train_microbatch_size": 2,
            "distributed_strategy": strategy,
            "model": {**model, "attention_layer_norm": False, "norm_after": False},
            "optimizer": {"learning_rate": 0.01},
            "data": {"paths": [str(tokens)]},
        }
        (tmp_path / f"{strategy}.yaml").write_text(yaml.safe_dump(cfg))
        command = [sys.executable, *launcher, "-m", "olmo_train", str(tmp_path / f"{strategy}.yaml")]
        proc = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        metrics = (tmp_path / strategy / "metrics.jsonl").read_text().splitlines()
        losses[strategy] = [json.loads(line)["train/loss"] for line in metrics]
    assert len(losses["fsdp"]) == 3 and losses["fsdp"] == pytest.approx(losses["single"], rel=1e-6)


# ---- `olmo` through export-hf and import-hf ----------------------------------------------------------------


def olmo1_config(**changes: Any) -> ModelConfig:
    base: dict[str, Any] = dict(d_model=64, n_heads=4, n_layers=2, vocab_size=VOCAB, max_sequence_length=SEQ)
    base |= dict(layer_norm_type="layer_norm", layer_norm_with_affine=False, layer_norm_eps=1e-5)
    base |= dict(attention_layer_norm=False, norm_after=False, init_std=0.1)
    return ModelConfig(**{**base, **changes})


@pytest.mark.parametrize("tied", [False, True])
def test_olmo_type_through_export_hf_and_import_hf(tmp_path: Path, tied: bool) -> None:
    model = olmo1_config(weight_tying=tied, n_kv_heads=2)
    torch.manual_seed(3)
    ours = Transformer(model).eval()
    checkpoint = write_imported(tmp_path / "ours", model, ours.state_dict())
    hf_dir = export_hf(checkpoint, tmp_path / "hf", check=True)
    config = json.loads((hf_dir / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["clip_qkv"]) == ("olmo", ["OlmoForCausalLM"], None)
    assert "rms_norm_eps" not in config  # OlmoLayerNorm's epsilon is fixed at 1e-5, not a config field
    hf = transformers.AutoModelForCausalLM.from_pretrained(hf_dir).eval()
    assert type(hf).__name__ == "OlmoForCausalLM"
    with torch.no_grad():
        assert max_diff(hf(input_ids=probe()).logits, ours(probe())) <= 1e-5

    back = import_hf(str(hf_dir), tmp_path / "back")
    imported = torch.load(back / "model.pt", weights_only=True)
    assert list(imported) == list(ours.state_dict())
    assert all(torch.equal(imported[k], v) for k, v in ours.state_dict().items())
    got = yaml.safe_load((back / "config.yaml").read_text())["model"]
    assert got == {**model.__dict__, "n_kv_heads": 2, "mlp_hidden_size": 256}


@pytest.mark.parametrize("tied", [False, True])
def test_the_olmo_table_names_every_transformers_tensor(tied: bool) -> None:
    model = olmo1_config(weight_tying=tied)
    config = hf_config(model, bos_token_id=None, eos_token_id=0, pad_token_id=1)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert expected_hf_names(model) == set(hf.state_dict()) - ({"lm_head.weight"} if tied else set())


def test_what_transformers_olmo_cannot_express_is_refused(tmp_path: Path) -> None:
    cases = {
        "affine": (
            olmo1_config(layer_norm_with_affine=True),
            r"model\.layer_norm_with_affine=true, .* no transformers",
        ),
        "eps": (olmo1_config(layer_norm_eps=1e-6), r"model\.layer_norm_eps=1e-06 has no transformers equivalent: olmo"),
    }
    for name, (model, match) in cases.items():
        checkpoint = write_imported(tmp_path / name, model, Transformer(model).state_dict())
        with pytest.raises(DataError, match=match):
            export_hf(checkpoint, tmp_path / f"{name}-hf")
        assert not (tmp_path / f"{name}-hf").exists()

    good = export_hf(
        write_imported(tmp_path / "good", olmo1_config(), Transformer(olmo1_config()).state_dict()), tmp_path / "hf"
    )
    config = json.loads((good / "config.json").read_text())
    (good / "config.json").write_text(json.dumps({**config, "clip_qkv": 8.0}))
    with pytest.raises(DataError, match=r"config\.json: clip_qkv is 8\.0; only None is supported"):
        import_hf(str(good), tmp_path / "clipped")
    assert not (tmp_path / "clipped").exists()


# ---- unsupported OLMo checkpoints: one line naming the key, nothing written --------------------------------

REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "alibi": ({"alibi": True, "rope": False}, r"model\.alibi is true; only false can be imported \(positions are RoPE"),
    "bias": ({"include_bias": True}, r"model\.include_bias is true; only false can be imported"),
    "bias-by-default": ({"include_bias": None}, r"model\.include_bias is true \(OLMo's default: the key is absent\)"),
    "clip": ({"clip_qkv": 8.0}, r"model\.clip_qkv is 8\.0; only null can be imported \(our attention does not clip"),
    "llama-block": ({"block_type": "llama"}, r"model\.block_type is \"llama\"; only \"sequential\" can be imported"),
    "moe": ({"block_type": "moe", "moe_num_experts": 8}, r"model\.block_type is \"moe\"; only \"sequential\" can be"),
    "unknown-key": ({"moe_num_experts": 8, "moe_top_k": 0}, r"model\.moe_num_experts is 8, an OLMo option this import"),
    "gelu": ({"activation_type": "gelu"}, r"model\.activation_type is \"gelu\"; only \"swiglu\""),
    "mqa-conflict": ({"n_kv_heads": 2, "multi_query_attention": True}, r"model\.n_kv_heads is 2 with model\.multi_q"),
    "qk-norm-without-scale": ({"attention_layer_norm": True}, r"model\.attention_layer_norm_with_affine is false"),
    "norm-type": ({"layer_norm_type": "amd_compatible"}, r"model\.layer_norm_type is \"amd_compatible\"; OLMo's kinds"),
    "shape": ({"n_layers": 3}, r"model\.pt: missing 4 tensors the config implies, e\.g\. \['transformer\.blocks\.2\."),
    "odd-mlp": ({"mlp_ratio": None, "mlp_hidden_size": 255}, r"model\.mlp_hidden_size \(ff_proj's width\) is 255; ex"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_unsupported_olmo_checkpoints_are_refused_by_key(case: str, tmp_path: Path) -> None:
    hf, _ = CASES["olmo1-tied"]()
    changes, match = REFUSED[case]
    source = write_olmo(tmp_path / "olmo", olmo_state_of(hf), olmo1_section(**changes))
    result = CliRunner().invoke(olmo_train_cli, ["import-olmo", str(source), "--destination", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.search(match, lines[0]), result.stderr
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_other_directories_are_refused(tmp_path: Path) -> None:
    hf, section = CASES["olmo1-tied"]()
    source = write_olmo(tmp_path / "olmo", olmo_state_of(hf), section)
    sharded = tmp_path / "step1000"
    shutil.copytree(source, sharded)
    (sharded / "model.pt").unlink()
    with pytest.raises(DataError, match=r"no model\.pt; only OLMo's unsharded checkpoints \(stepN-unsharded\)"):
        import_olmo(str(sharded), tmp_path / "out")
    ours = import_olmo(str(source), tmp_path / "ours")
    with pytest.raises(DataError, match=r"a checkpoint of this project \(trainer_state\.json\), not OLMo's"):
        import_olmo(str(ours), tmp_path / "out")
    with pytest.raises(DataError, match=r"the destination exists"):
        import_olmo(str(source), ours)
    pickled = tmp_path / "pickled"
    shutil.copytree(source, pickled)
    torch.save({"transformer.wte.weight": torch.zeros(2), "extra": object()}, pickled / "model.pt")
    with pytest.raises(DataError, match=r"pickled/model\.pt: cannot be read as a state dict of tensors"):
        import_olmo(str(pickled), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_olmo_needs_no_transformers() -> None:
    code = "import sys; sys.modules['transformers'] = None; import olmo_train.convert.olmo_native, cli.import_olmo"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True, timeout=120)
