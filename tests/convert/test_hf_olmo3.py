"""OLMo 3 (`model_type: olmo3`) in and out: tiny random `Olmo3ForCausalLM` models built and saved by transformers
itself (sliding and full layers mixed, windows shorter than the sequence, GQA, with and without YaRN on sequences
longer than the original context) import with transformers' logits, export back to the same logits, decode
greedily to transformers' continuation past the window, and train with per-instance losses equal to transformers'
cross-entropy; what we cannot compute is refused by name."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from olmo_data.config import ModelConfig, SlidingWindowConfig, load_config
from olmo_data.errors import DataError
from olmo_train.convert import expected_hf_names, export_hf, hf_config, import_hf, read_hf_dir
from olmo_train.generate import generate
from olmo_train.nn import Transformer, doc_ids_from_eos

transformers = pytest.importorskip("transformers")

VOCAB, T = 2048, 48  # the demo tokenizer's vocabulary; sequences longer than every window and than YaRN's context
SLIDING, FULL = "sliding_attention", "full_attention"
MODELS: dict[str, dict[str, Any]] = {
    # mixed layer types (a sliding last layer too), GQA 4:2, a 6-token window
    "sliding-gqa": {"num_key_value_heads": 2, "sliding_window": 6, "layer_types": [SLIDING, SLIDING, FULL, SLIDING]},
    # transformers' default types (every fourth full), GQA 4:1, YaRN x4 over an original context of 16 tokens
    "yarn": {
        "num_key_value_heads": 1,
        "sliding_window": 5,
        "rope_parameters": {
            FULL: {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16},
            SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
        },
    },
}


def hf_olmo3(name: str, seed: int) -> Any:
    torch.manual_seed(seed)
    config = transformers.Olmo3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        max_position_embeddings=64,
        initializer_range=0.1,
        rms_norm_eps=1e-6,
        eos_token_id=0,
        pad_token_id=1,
        **MODELS[name],
    )
    return transformers.Olmo3ForCausalLM(config).eval()


@pytest.fixture(scope="module")
def saved(demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """name -> a transformers directory written by save_pretrained (safetensors), with the demo tokenizer."""
    out = {}
    for seed, name in enumerate(MODELS):
        directory = tmp_path_factory.mktemp(name) / "hf"
        hf_olmo3(name, seed).save_pretrained(directory)
        shutil.copyfile(demo_tokenizer, directory / "tokenizer.json")
        out[name] = directory
    return out


@pytest.fixture(scope="module")
def imported(saved: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {name: import_hf(str(d), tmp_path_factory.mktemp(name) / "ours", check=True) for name, d in saved.items()}


def ours_of(checkpoint: Path, **changes: Any) -> Transformer:
    cfg = load_config(checkpoint / "config.yaml", require_data=False).model
    for key, value in changes.items():
        setattr(cfg, key, value)
    model = Transformer(cfg)
    model.load_state_dict(torch.load(checkpoint / "model.pt", weights_only=True))
    return model.eval()


def probe(seed: int = 0, batch: int = 2, length: int = T) -> torch.Tensor:
    return torch.randint(2, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def theirs(directory: Path) -> Any:
    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()


@pytest.mark.parametrize("name", list(MODELS))
def test_import_gives_transformers_logits(name: str, saved: dict[str, Path], imported: dict[str, Path]) -> None:
    cfg = load_config(imported[name] / "config.yaml", require_data=False).model
    windows = [6, 6, None, 6] if name == "sliding-gqa" else [5, 5, 5, None]
    assert cfg.attention_windows() == windows and (cfg.yarn() is not None) is (name == "yarn")
    ids = probe()
    with torch.no_grad():
        want = theirs(saved[name])(input_ids=ids).logits
        got = ours_of(imported[name])(ids)
        # the test can fail: a window one token wider, or no YaRN, is another function
        wider = ours_of(imported[name], sliding_window=cfg.sliding_window + 1)(ids)  # type: ignore[operator]
        unscaled = ours_of(imported[name], rope_scaling=None)(ids)
    diff = float((got - want).abs().max())
    print(f"{name}: max abs logit difference {diff:.3g} (logits up to {float(want.abs().max()):.3g})")
    assert diff <= 1e-4
    assert float((wider - want).abs().max()) > 1e-3
    assert name != "yarn" or float((unscaled - want).abs().max()) > 1e-3


@pytest.mark.parametrize("name", list(MODELS))
def test_export_loads_back_with_the_same_logits(
    name: str, saved: dict[str, Path], imported: dict[str, Path], tmp_path: Path
) -> None:
    out = export_hf(imported[name], tmp_path / "hf", check=True)
    config = json.loads((out / "config.json").read_text())
    original = json.loads((saved[name] / "config.json").read_text())
    assert config["model_type"] == "olmo3" and config["architectures"] == ["Olmo3ForCausalLM"]
    for key in ("layer_types", "sliding_window", "num_key_value_heads"):
        assert config[key] == original[key], key
    for kind in (SLIDING, FULL):  # both forms: transformers 5's per layer type, 4.57's rope_scaling
        want = {k: float(v) if isinstance(v, int) else v for k, v in original["rope_parameters"][kind].items()}
        assert {k: config["rope_parameters"][kind][k] for k in want} == want
    assert (config["rope_scaling"] or {}).get("rope_type") == ("yarn" if name == "yarn" else None)
    ids = probe(1)
    with torch.no_grad():
        diff = (theirs(out)(input_ids=ids).logits - theirs(saved[name])(input_ids=ids).logits).abs().max()
    assert float(diff) <= 1e-5
    assert read_hf_dir(str(out))[0] == read_hf_dir(str(saved[name]))[0]


@pytest.mark.parametrize("name", list(MODELS))
def test_greedy_generation_is_transformers_past_the_window(
    name: str, saved: dict[str, Path], imported: dict[str, Path]
) -> None:
    prompts = [probe(2, 1, 10)[0].tolist(), probe(3, 1, 4)[0].tolist()]  # padded together in ours
    ours = generate(ours_of(imported[name]), prompts, 30)
    hf = theirs(saved[name])
    for row, prompt in enumerate(prompts):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want = hf.generate(ids, max_new_tokens=30, min_new_tokens=30, do_sample=False)[0, len(prompt) :]
        assert ours.token_ids[row, 0].tolist() == want.tolist(), (name, row)


@pytest.mark.parametrize("name", list(MODELS))
def test_instance_losses_are_transformers_cross_entropy(
    name: str, saved: dict[str, Path], imported: dict[str, Path]
) -> None:
    """Windows with document masking: each instance's loss is transformers' cross-entropy summed over its
    documents, each run through transformers alone; without document masking, over the whole row."""
    hf = theirs(saved[name])
    ids = probe(4)
    ids[0, [9, 30]] = 0  # EOS ends a document: three documents in row 0, two in row 1
    ids[1, 20] = 0
    labels = ids[:, 1:].clone()
    labels[1, :3] = -100  # not trained
    for masking in (False, True):
        model = ours_of(imported[name], document_masking=masking, document_positions=masking, eos_token_id=0)
        model.train()
        doc = doc_ids_from_eos(ids, 0) if masking else torch.zeros_like(ids)
        _, _, rows = model(ids, labels=labels, doc_ids=doc if masking else None, instance_losses=True)
        for r in range(2):
            want = 0.0
            with torch.no_grad():
                for d in doc[r].unique():
                    span = (doc[r] == d).nonzero().flatten()
                    a, b = int(span[0]), min(int(span[-1]) + 1, T - 1)
                    logits = hf(input_ids=ids[r : r + 1, a : int(span[-1]) + 1]).logits[0, : b - a]
                    want += float(F.cross_entropy(logits, labels[r, a:b], reduction="sum", ignore_index=-100))
            assert float(rows[r]) == pytest.approx(want, rel=1e-5, abs=1e-4), (name, masking, r)


def test_transformers_4_57s_form_reads_the_same(saved: dict[str, Path], tmp_path: Path) -> None:
    """rope_theta and rope_scaling at the top (as transformers 4.57 and the hub's OLMo 3 configs write them)."""
    directory = tmp_path / "old"
    shutil.copytree(saved["yarn"], directory)
    config = json.loads((directory / "config.json").read_text())
    full = config.pop("rope_parameters")[FULL]
    config.update(rope_theta=full.pop("rope_theta"), rope_scaling=full)
    (directory / "config.json").write_text(json.dumps(config))
    assert read_hf_dir(str(directory))[0] == read_hf_dir(str(saved["yarn"]))[0]


def test_olmo3_table_names_every_transformers_tensor() -> None:
    model = ModelConfig(d_model=64, n_heads=4, n_layers=4, vocab_size=VOCAB, n_kv_heads=2)
    model.sliding_window = SlidingWindowConfig([8, 8, 8, -1], False, True)
    config = hf_config(model, bos_token_id=None, eos_token_id=0, pad_token_id=1)
    assert config["layer_types"] == [SLIDING, SLIDING, SLIDING, FULL] and config["sliding_window"] == 8
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    assert type(hf).__name__ == "Olmo3ForCausalLM" and expected_hf_names(model) == set(hf.state_dict())


def test_what_olmo3_cannot_be_is_refused(saved: dict[str, Path], tmp_path: Path) -> None:
    def variant(name: str, edit: Any) -> str:
        directory = tmp_path / name
        shutil.copytree(saved["yarn"], directory)
        config = json.loads((directory / "config.json").read_text())
        edit(config)
        (directory / "config.json").write_text(json.dumps(config))
        return str(directory)

    def rope(kind: str, **changes: Any) -> Any:
        return lambda c: c["rope_parameters"][kind].update(changes)

    cases = {
        variant("yarn-sliding", rope(SLIDING, rope_type="yarn", factor=2.0)): r"sliding_attention has rope_type 'yarn'",
        variant("two-bases", rope(SLIDING, rope_theta=500000.0)): r"the RoPE bases \[10000.0, 500000.0\]",
        variant("linear", rope(FULL, rope_type="linear")): r"rope_type is 'linear'; only default and yarn",
        variant("unknown-key", rope(FULL, low_freq_factor=1.0)): r"YaRN parameter 'low_freq_factor' is not computed",
        variant("no-window", lambda c: c.update(sliding_window=None)): r"sliding_window is null, but layer_types",
        variant("types", lambda c: c.update(layer_types=[SLIDING])): r"layer_types is \['sliding_attention'\]",
        variant("bad-factor", rope(FULL, factor=-2)): r"YaRN's factor is -2; expected a number above 0",
    }
    for directory, match in cases.items():
        with pytest.raises(DataError, match=match):
            import_hf(directory, tmp_path / "dest")
        assert not (tmp_path / "dest").exists()
    model = ModelConfig(d_model=64, n_heads=4, n_layers=4, vocab_size=VOCAB)
    model.sliding_window = SlidingWindowConfig([8, 16], False, True)
    with pytest.raises(DataError, match=r"windows of \[8, 16\] tokens: transformers' olmo3 has one sliding_window"):
        hf_config(model, bos_token_id=None, eos_token_id=0, pad_token_id=1)
    model.sliding_window, model.norm_after, model.attention_layer_norm = SlidingWindowConfig([8]), False, False
    with pytest.raises(DataError, match=r"attention windows or RoPE scaling with model.layer_norm_type=rms"):
        hf_config(model, bos_token_id=None, eos_token_id=0, pad_token_id=1)
