"""Document-masked attention: a packed instance computes each of its documents exactly as that document alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from olmo_data.config import ModelConfig
from olmo_train.nn import Transformer, doc_ids_from_eos, doc_ids_from_starts, document_mask, document_positions
from olmo_train.train import boundary_token

EOS = 0


def packed(lengths: list[list[int]], vocab: int = 97, seed: int = 0) -> torch.Tensor:
    """Rows of documents of the given lengths, each ending with EOS (the last may be cut: no EOS)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for row in lengths:
        parts = []
        for n in row:
            doc = torch.randint(1, vocab, (n,), generator=g)
            doc[-1] = EOS
            parts.append(doc)
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def model(**kw: object) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, vocab_size=97, max_sequence_length=64, **kw)  # type: ignore[arg-type]
    return Transformer(cfg).eval()


def test_ids_masks_and_positions() -> None:
    ids = torch.tensor([[5, 0, 7, 8, 0, 9], [0, 0, 3, 4, 5, 6]])
    doc = doc_ids_from_eos(ids, EOS)
    assert doc.tolist() == [[0, 0, 1, 1, 1, 2], [0, 1, 2, 2, 2, 2]]
    assert document_positions(doc).tolist() == [[0, 1, 0, 1, 2, 0], [0, 0, 0, 1, 2, 3]]
    starts = torch.tensor([[True, False, True, False, False, True]])
    assert doc_ids_from_starts(starts).tolist() == [[0, 0, 1, 1, 1, 2]]
    m = document_mask(doc)[0, 0]
    assert m[3].tolist() == [False, False, True, True, False, False]  # token 3 sees tokens 2..3 only
    assert m[5].tolist() == [False] * 5 + [True]


@pytest.mark.parametrize(("restart_positions", "attention"), [(True, "mask"), (False, "mask"), (True, "flex")])
def test_packed_logits_equal_each_document_alone(restart_positions: bool, attention: str) -> None:
    net = model(document_masking=True, document_positions=restart_positions, document_attention=attention)
    lengths = [[7, 20, 5, 32], [64]]
    ids = packed(lengths)
    with torch.no_grad():
        got = net(ids, doc_ids=doc_ids_from_eos(ids, EOS))
        for row, row_lengths in enumerate(lengths):
            start = 0
            for n in row_lengths:
                alone_ids = ids[row : row + 1, start : start + n]
                positions = None if restart_positions else torch.arange(start, start + n)[None]
                alone = net(alone_ids, positions=positions)
                torch.testing.assert_close(got[row, start : start + n], alone[0], rtol=0, atol=1e-5)
                start += n
        plain = net(ids)  # without the masks the later documents see the earlier ones: different logits
    assert (plain[0, 7:] - got[0, 7:]).abs().max() > 1e-3
    torch.testing.assert_close(plain[0, :7], got[0, :7], rtol=0, atol=1e-5)


def test_the_packed_loss_is_the_sum_of_the_documents_losses() -> None:
    """What SFT on packed conversations needs: the loss of a packed row equals its conversations' losses summed."""
    net = model(document_masking=True, document_positions=True)
    ids = packed([[10, 30, 24]], seed=3)
    labels = ids[:, 1:].clone()
    labels[0, 9] = -100  # never predict across a boundary: the first token of the next document
    labels[0, 39] = -100
    with torch.no_grad():
        whole = net(ids, labels=labels, doc_ids=doc_ids_from_eos(ids, EOS))
        parts = sum(net(ids[:, a:b], labels=ids[:, a + 1 : b]) for a, b in ((0, 10), (10, 40), (40, 64)))
    torch.testing.assert_close(whole, parts, rtol=1e-6, atol=1e-5)


def test_training_with_document_masking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from olmo_train.train import main

    tokens = tmp_path / "tokens.npy"
    packed([[9, 23, 32, 16, 16, 32]] * 4, seed=1).numpy().astype(np.uint16).tofile(tokens)
    cfg = {
        "save_folder": str(tmp_path / "run"),
        "max_duration": 2,
        "global_train_batch_size": 4,
        "device_train_microbatch_size": 2,
        "distributed_strategy": "single",
        "model": {
            "d_model": 32,
            "n_heads": 2,
            "n_layers": 1,
            "vocab_size": 97,
            "max_sequence_length": 64,
            "document_masking": True,
            "document_positions": True,
        },
        "data": {"paths": [str(tokens)]},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main([str(path)]) == 2
    assert "model.eos_token_id is not set and the token files' manifests record none" in capsys.readouterr().err
    assert main([str(path), f"--model.eos_token_id={EOS}"]) == 0
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["model"]["eos_token_id"] == EOS and saved["model"]["document_masking"] is True
    assert boundary_token(5, []) == 5
