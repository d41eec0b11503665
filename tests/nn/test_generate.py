"""Generation: the KV cache gives the logits of a full forward pass, left padding changes nothing, a seed
reproduces a sample, beams are scored and ordered as promised, and greedy decoding and beam search give the
tokens `transformers` gives on the same weights."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from olmo_data.config import ModelConfig
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_train.convert import load_model
from olmo_train.generate import GenerationOutput, KVCache, Sampling, generate
from olmo_train.nn import Transformer

REPO = Path(__file__).resolve().parents[2]


def tiny(seed: int = 0, **kw: Any) -> Transformer:
    """A random model with peaked distributions (init_std 0.2), so greedy choices are not near-ties."""
    args: dict[str, Any] = dict(
        d_model=64, n_heads=4, n_kv_heads=2, n_layers=3, vocab_size=300, max_sequence_length=32, rope_theta=1e4
    )
    args.update(kw)
    torch.manual_seed(seed)
    return Transformer(ModelConfig(init_std=0.2, **args)).eval()


def sequence_logprob(model: Transformer, prompt: list[int], continuation: list[int]) -> float:
    """Sum of the log-probabilities of `continuation` after `prompt`, from one plain forward pass."""
    ids = torch.tensor([prompt + continuation])
    with torch.no_grad():
        logp = model(ids)[0].double().log_softmax(-1)
    return sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(continuation))


def test_cache_gives_the_logits_of_a_full_forward() -> None:
    model = tiny()
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids)
        cache = KVCache(model, 2, 20, torch.float32, torch.device("cpu"))
        parts = [model(ids[:, :12], cache=cache.layers)]
        for t in range(12, 20):
            pos = torch.full((2, 1), t)
            parts.append(model(ids[:, t : t + 1], positions=pos, cache=cache.layers))
    torch.testing.assert_close(torch.cat(parts, 1), full, atol=1e-5, rtol=0)


def test_runs_past_the_trained_length() -> None:
    model = tiny()  # max_sequence_length 32
    ids = torch.randint(0, 300, (1, 45), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        long = model(ids)
        short = model(ids[:, :32])
    assert long.shape == (1, 45, 300)
    torch.testing.assert_close(long[:, :32], short, atol=1e-6, rtol=0)  # causal: the first 32 are unchanged
    out = generate(model, ids[:, :30].tolist(), 20)  # prompt + continuation = 50 > 32
    assert out.token_ids.shape == (1, 1, 20)


@pytest.mark.parametrize("beam_size", [1, 3])
def test_left_padded_batch_gives_each_row_its_own_tokens(beam_size: int) -> None:
    model = tiny()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (4, 11, 7)]
    batch = generate(model, prompts, 12, beam_size=beam_size)
    for row, prompt in enumerate(prompts):
        alone = generate(model, [prompt], 12, beam_size=beam_size)
        assert torch.equal(batch.token_ids[row], alone.token_ids[0]), f"row {row}"
        torch.testing.assert_close(batch.scores[row], alone.scores[0], atol=1e-4, rtol=0)


def test_beams_are_sorted_and_scored_by_their_log_likelihood() -> None:
    model = tiny(seed=4)
    prompt = [5, 17, 42, 99]
    out = generate(model, [prompt], 6, beam_size=4)
    scores = out.scores[0].tolist()
    assert scores == sorted(scores, reverse=True)
    assert len({tuple(b) for b in out.token_ids[0].tolist()}) == 4  # four different beams
    for beam, score in zip(out.token_ids[0].tolist(), scores, strict=True):
        assert sequence_logprob(model, prompt, beam) == pytest.approx(score, abs=1e-4)
    greedy = generate(model, [prompt], 6)
    assert out.scores[0, 0] >= greedy.scores[0, 0] - 1e-5  # beam search finds at least the greedy path's score


def test_sampling_is_reproducible_from_the_first_token() -> None:
    model = tiny(seed=5)
    sampler = Sampling(temperature=1.5, top_k=100, top_p=0.95)
    a = generate(model, [[1, 2, 3]], 15, sampler=sampler, seed=7)
    b = generate(model, [[1, 2, 3]], 15, sampler=sampler, seed=7)
    first = generate(model, [[1, 2, 3]], 1, sampler=sampler, seed=7)
    assert torch.equal(a.token_ids, b.token_ids)
    assert torch.equal(first.token_ids[..., 0], a.token_ids[..., 0])
    others = {
        tuple(generate(model, [[1, 2, 3]], 15, sampler=sampler, seed=s).token_ids.flatten().tolist()) for s in range(5)
    }
    assert len(others) > 1  # the seed matters


def test_sampling_cuts_reduce_to_greedy() -> None:
    model = tiny(seed=6)
    greedy = generate(model, [[9, 8, 7]], 10)
    for sampler in (Sampling(top_k=1), Sampling(top_p=1e-6), Sampling(temperature=1e-4)):
        assert torch.equal(generate(model, [[9, 8, 7]], 10, sampler=sampler, seed=0).token_ids, greedy.token_ids)
    with pytest.raises(Exception, match="temperature must be > 0"):
        Sampling(temperature=0)


def test_stop_ids_and_min_steps() -> None:
    model = tiny(seed=7)
    free = generate(model, [[4, 5, 6]], 8).token_ids[0, 0].tolist()
    stop = free[1]
    out = generate(model, [[4, 5, 6]], 8, stop_ids=[12345 % 300, stop])
    assert out.token_ids[0, 0].tolist() == free[:2]  # ends right after the stop id (the only beam is done)
    later = generate(model, [[4, 5, 6]], 8, stop_ids=[stop], min_steps=3).token_ids[0, 0].tolist()
    assert stop not in later[:3]
    beams = generate(model, [[4, 5, 6]], 8, beam_size=3, stop_ids=[stop])
    for beam in beams.token_ids[0].tolist():  # after a stop id only the stop id follows
        if stop in beam:
            assert set(beam[beam.index(stop) :]) == {stop}


# --- against transformers ---------------------------------------------------------------------------------------


def hf_twin(model: Transformer) -> Any:
    """The `transformers` model with our weights, through the export mapping."""
    transformers = pytest.importorskip("transformers")
    from olmo_train.convert import hf_config, to_hf_state

    config = hf_config(model.cfg, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**config))
    hf.load_state_dict(to_hf_state(model.state_dict(), model.cfg), strict=False)
    return hf.eval()


@pytest.mark.parametrize(
    "shape",
    [
        {},  # olmo2, GQA, untied
        {"weight_tying": True, "n_kv_heads": None},
        {"norm_after": False, "attention_layer_norm": False},  # llama
    ],
)
def test_greedy_and_beam_search_equal_transformers(shape: dict[str, Any]) -> None:
    model = tiny(seed=8, **shape)
    hf = hf_twin(model)
    prompt = torch.randint(0, 300, (1, 9), generator=torch.Generator().manual_seed(9))
    ours = generate(model, prompt, 40)  # past max_sequence_length
    ref = hf.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False, eos_token_id=None)
    assert ours.token_ids[0, 0].tolist() == ref[0, 9:].tolist()
    ours = generate(model, prompt, 10, beam_size=4)
    ref = hf.generate(
        prompt,
        max_new_tokens=10,
        min_new_tokens=10,
        num_beams=4,
        do_sample=False,
        eos_token_id=None,
        length_penalty=1.0,
    )
    assert ours.token_ids[0, 0].tolist() == ref[0, 9:].tolist()


# --- a model trained on the demo data ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(demo_corpus: list[str], demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for 12 steps on the demo tokens (1 process); its save folder."""
    tmp = tmp_path_factory.mktemp("trained")
    tokenize(demo_corpus[:1], tmp / "tokens", TokenizeOptions(tokenizer=demo_tokenizer, backend="hf"))
    config = {
        "run_name": "gen",
        "save_folder": str(tmp / "run"),
        "max_duration": 12,
        "global_train_batch_size": 8,
        "device_train_microbatch_size": 8,
        "distributed_strategy": "single",
        "save_interval": 12,
        "save_interval_unsharded": 12,
        "model": {"d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 2048, "max_sequence_length": 64},
        "optimizer": {"learning_rate": 0.01},
        "scheduler": {"name": "constant"},
        "data": {"paths": [str(tmp / "tokens")]},
    }
    (tmp / "config.yaml").write_text(yaml.safe_dump(config))
    subprocess.run(
        [sys.executable, "-m", "olmo_train", str(tmp / "config.yaml")], check=True, cwd=REPO, capture_output=True
    )
    return tmp / "run"


def test_load_model_from_a_trained_checkpoint(trained: Path, demo_tokenizer: str) -> None:
    sharded, tok = load_model(trained / "step12")
    unsharded, tok2 = load_model(trained / "step12-unsharded")
    assert not sharded.training
    for (name, a), (_, b) in zip(sharded.state_dict().items(), unsharded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert tok is not None and tok2 is not None
    assert tok.sha256 == tok2.sha256 == load_model_tokenizer_sha(demo_tokenizer)
    prompt = tok.encode("def main():\n    ")
    out: GenerationOutput = generate(sharded, [prompt], 12, beam_size=2)
    assert out.token_ids.shape == (1, 2, 12)
    hf = hf_twin(sharded)
    ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, min_new_tokens=12, do_sample=False, eos_token_id=None)
    assert generate(sharded, [prompt], 12).token_ids[0, 0].tolist() == ref[0, len(prompt) :].tolist()


def load_model_tokenizer_sha(path: str) -> str:
    from olmo_data.tokenizer import load_tokenizer

    return load_tokenizer(path, "hf").sha256


def test_generate_command(trained: Path) -> None:
    from click.testing import CliRunner

    from olmo_cli.train_main import main

    runner = CliRunner()
    args = ["generate", str(trained / "step12"), "--prompt", "import os", "--prompt", "def f(x):", "--max-steps", "8"]
    greedy = runner.invoke(main, args)
    assert greedy.exit_code == 0, greedy.output
    lines = greedy.stdout.splitlines()
    assert len(lines) == 2 and lines[0].startswith("import os") and lines[1].startswith("def f(x):")
    assert "tokens/s" in greedy.stderr
    beams = runner.invoke(main, [*args, "--beam-size", "3", "--all-beams"])
    assert beams.exit_code == 0 and beams.stdout.count("[beam ") == 6, beams.output
    sampled = [runner.invoke(main, [*args, "--temperature", "1.2", "--seed", "3"]).stdout for _ in range(2)]
    assert sampled[0] == sampled[1]
    missing = runner.invoke(main, ["generate", str(trained / "step99"), "--prompt", "x"])
    assert missing.exit_code == 2 and "no such checkpoint or model directory" in missing.output


@pytest.mark.parametrize("name", ["step12", "step12-unsharded"])
def test_load_model_from_a_url(
    trained: Path, http_root: tuple[Path, str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    root, url = http_root
    shutil.copytree(trained / name, root / name)
    monkeypatch.setenv("OLMO_DATA_CACHE", str(tmp_path / "cache"))
    remote, tok = load_model(f"{url}/{name}")
    local, _ = load_model(trained / name)
    for (key, a), (_, b) in zip(remote.state_dict().items(), local.state_dict().items(), strict=True):
        assert torch.equal(a, b), key
    assert tok is not None and tok.decode(tok.encode("def f(): pass")) == "def f(): pass"
