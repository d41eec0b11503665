"""OLMo 3 checkpoints from OLMo-core in: a tiny model of OLMo-core's `olmo3_*` shape (OLMo 2's block with GQA and
sliding-window attention, pattern [w, w, w, -1] with only the last layer held full), with and without YaRN on the
full-attention layers as OLMo-core's `with_rope_scaling` puts it (block_overrides), trained a step and saved by
OLMo-core's own train module and Checkpointer, imports with `import-olmo-core`; our logits are OLMo-core's on a
sequence longer than the window and than YaRN's original context. What we cannot compute is refused by its key."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import CliRunner

from olmo_cli.train_main import main as olmo_train_cli
from olmo_train.convert import load_model
from olmo_train.nn import Transformer
from tests.convert.test_import_olmo_core import HAVE_CORE, ROWS, SEQ, batch, edit, max_diff, save_core_checkpoint

if HAVE_CORE:
    from olmo_core.nn.attention import SlidingWindowAttentionConfig
    from olmo_core.nn.rope import YaRNRoPEScalingConfig
    from olmo_core.nn.transformer import TransformerBlockType, TransformerConfig

needs_core = pytest.mark.skipif(not HAVE_CORE, reason="ai2-olmo-core is not installed (the olmo-core extra)")
WINDOW, OLD_CONTEXT = 5, 8  # both shorter than SEQ (16): the window and YaRN's scaling both matter


def olmo3_config(yarn: bool) -> Any:
    """OLMo-core's olmo3 shape at a tiny size: olmo3_* is olmo2_* (reordered norm, QK-norm) plus this window."""
    window = SlidingWindowAttentionConfig(
        pattern=[WINDOW, WINDOW, WINDOW, -1],
        force_full_attention_on_first_layer=False,
        force_full_attention_on_last_layer=True,
    )
    cfg = TransformerConfig.llama_like(
        d_model=32,
        vocab_size=ROWS,
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        hidden_size_multiple_of=16,
        qk_norm=True,
        block_name=TransformerBlockType.reordered_norm,
        layer_norm_eps=1e-6,
        sliding_window=window,
    )
    if yarn:
        scaling = YaRNRoPEScalingConfig(factor=4.0, beta_fast=32, beta_slow=1, old_context_len=OLD_CONTEXT)
        cfg = cfg.with_rope_scaling(scaling)  # on the full-attention layers only (block_overrides)
    return cfg


@needs_core
@pytest.mark.parametrize("yarn", [False, True], ids=["windows", "windows-yarn"])
def test_an_olmo3_checkpoint_of_olmo_core_imports_with_its_logits(yarn: bool, tmp_path: Path) -> None:
    source, core = save_core_checkpoint(tmp_path / "core", "olmo3", optim="adamw", steps=1, cfg=olmo3_config(yarn))
    ids = batch(7, n=2)
    with torch.no_grad():
        expected = core(ids)
    result = CliRunner().invoke(olmo_train_cli, ["import-olmo-core", str(source), "--destination", str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load((tmp_path / "o" / "config.yaml").read_text())["model"]
    assert cfg["sliding_window"] == {
        "pattern": [WINDOW, WINDOW, WINDOW, -1],
        "force_full_attention_on_first_layer": False,
        "force_full_attention_on_last_layer": True,
    }
    assert cfg["n_kv_heads"] == 2 and cfg["norm_after"] is True
    if yarn:
        assert cfg["rope"]["scaling"] == {"factor": 4.0, "beta_fast": 32, "beta_slow": 1, "old_context_len": 8}
    else:
        assert cfg.get("rope") is None
    ours, _ = load_model(tmp_path / "o")
    direct, _ = load_model(source)  # OLMo-core's step folder itself, without an import
    assert ours.cfg.attention_windows() == direct.cfg.attention_windows() == [WINDOW, WINDOW, WINDOW, None]
    with torch.no_grad():
        for model in (ours, direct):
            got = model(ids)
            print(f"olmo3 (yarn={yarn}): max abs logit difference {max_diff(got, expected):.3g}")
            assert got.shape == expected.shape == (2, SEQ, ROWS) and max_diff(got, expected) <= 1e-4
    # the windows (and YaRN) are what makes it agree: the same weights without them give other logits
    plain = Transformer(replace(ours.cfg, sliding_window=None, rope=None))
    plain.load_state_dict(ours.state_dict())
    with torch.no_grad():
        assert max_diff(plain(ids), expected) > 1e-2
        if yarn:
            unscaled = Transformer(replace(ours.cfg, rope=None))
            unscaled.load_state_dict(ours.state_dict())
            assert max_diff(unscaled(ids), expected) > 1e-3


REFUSED: dict[str, tuple[str, Any, str]] = {
    "pattern": ("model.block.sequence_mixer.sliding_window.pattern", [4, 0], r"sliding_window\.pattern is \[4, 0\]"),
    "window-class": (
        "model.block.sequence_mixer.sliding_window._CLASS_",
        "olmo_core.nn.attention.ChunkedAttentionConfig",
        r"sliding_window is a olmo_core\.nn\.attention\.ChunkedAttentionConfig; only SlidingWindowAttentionConfig",
    ),
    "scaling-class": (
        "model.block_overrides.3.sequence_mixer.rope.scaling._CLASS_",
        "olmo_core.nn.rope.PIRoPEScalingConfig",
        r"block_overrides\.3\.sequence_mixer\.rope\.scaling is a olmo_core\.nn\.rope\.PIRoPEScalingConfig; only YaRN",
    ),
    "scaling-everywhere": (
        "model.block.sequence_mixer.rope.scaling",
        {"factor": 4.0, "_CLASS_": "olmo_core.nn.rope.YaRNRoPEScalingConfig"},
        r"model\.block\.sequence_mixer\.rope\.scaling scales every layer, windowed ones too",
    ),
    "override-layers": (
        "model.block_overrides.2",
        "copy of 3",
        r"model\.block_overrides overrides layers \['2', '3'\]; only YaRN on exactly the full-attention layers \[3\]",
    ),
    "override-other": (
        "model.block_overrides.3.feed_forward.hidden_size",
        128,
        r"model\.block_overrides\.3 differs from model\.block in more than sequence_mixer\.rope\.scaling",
    ),
    "no-global-rope": ("model.block.sequence_mixer.rope.no_global_rope", True, r"rope\.no_global_rope is true; only"),
}


@pytest.fixture(scope="module")
def olmo3_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_core_checkpoint(tmp_path_factory.mktemp("core"), "olmo3", optim=None, cfg=olmo3_config(True))[0]


@needs_core
@pytest.mark.parametrize("case", list(REFUSED))
def test_what_we_cannot_compute_of_olmo3_is_refused_by_key(case: str, olmo3_source: Path, tmp_path: Path) -> None:
    key, value, match = REFUSED[case]
    source = tmp_path / olmo3_source.name
    shutil.copytree(olmo3_source, source)
    config = json.loads((source / "config.json").read_text())
    if value == "copy of 3":
        value = config["model"]["block_overrides"]["3"]
    edit(config, key, value)
    (source / "config.json").write_text(json.dumps(config))
    result = CliRunner().invoke(olmo_train_cli, ["import-olmo-core", str(source), "--destination", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and re.search(match, lines[0]) and "config.json" in lines[0], result.stderr
    assert not (tmp_path / "o").exists()
