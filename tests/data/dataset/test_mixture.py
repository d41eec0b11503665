"""Mixtures: shares, budgets, deterministic down-sampling and repetition, the mix manifest and its readers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.doc_index import DocIndex
from olmo_data.dataset.instances import open_dataset
from olmo_data.dataset.mixture import build_mix, parse_spec, select_instances
from olmo_data.dataset.order import build_config_orders
from olmo_data.errors import DataError
from olmo_data.run.batches import inspect_batch

SEQ = 8


def make_source(directory: Path, name: str, sizes: list[int], base: int) -> list[str]:
    """Token files whose token p of file k is base + 1000*k + p, so that each instance says where it is."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, n in enumerate(sizes):
        p = directory / f"{name}-{k}.npy"
        (base + 1000 * k + np.arange(n)).astype(np.uint32).tofile(p)
        paths.append(str(p))
    return paths


@pytest.fixture
def sources(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "web": make_source(tmp_path / "web", "web", [403, 205], 1_000_000),  # 50 + 25 = 75 instances
        "code": make_source(tmp_path / "code", "code", [161], 2_000_000),  # 20 instances
    }


def spec(sources: dict[str, list[str]], **kw: Any) -> dict[str, Any]:
    shares = kw.pop("shares", {"web": 0.8, "code": 0.2})
    return {
        "seed": kw.pop("seed", 5),
        "sequence_length": SEQ,
        "dtype": "uint32",
        "sources": [{"name": n, "paths": sources[n], "share": s} for n, s in shares.items()],
        **kw,
    }


def instance_tokens(paths: list[str], seq: int = SEQ) -> np.ndarray:
    chunks = []
    for p in paths:
        a = np.fromfile(p, dtype="<u4")
        chunks.append(a[: len(a) // seq * seq].reshape(-1, seq))
    return np.concatenate(chunks).astype(np.int64)


def test_shares_select_without_repetition(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    m = build_mix(parse_spec(spec(sources)), str(tmp_path / "mix"))
    web, code = m["sources"]
    # the largest mix that repeats nothing: web is the scarcer one relative to its share (75 / 0.8 < 20 / 0.2)
    assert (web["selected_instances"], code["selected_instances"]) == (75, 19)
    assert web["realized_share"] == pytest.approx(75 / 94, abs=1e-6)
    assert web["requested_share"] == 0.8 and code["repeats"] == pytest.approx(19 / 20)
    ids = np.load(tmp_path / "mix" / "code.ids.npy")
    assert len(set(ids.tolist())) == 19 and ids.max() < 20 and np.all(np.diff(ids) >= 0)

    ds = open_dataset(mix=str(tmp_path / "mix"), sequence_length=SEQ)
    assert len(ds) == 94
    tokens, masks = ds.get_batch(np.arange(94))
    assert masks is None
    np.testing.assert_array_equal(tokens[:75], instance_tokens(sources["web"]))
    np.testing.assert_array_equal(tokens[75:], instance_tokens(sources["code"])[ids])
    assert ds.locate_many([80])[0].source == "code"
    assert ds.locate(75) == (sources["code"][0], int(ids[0]) * SEQ)


def test_total_tokens_and_budgets_repeat_sources(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    m = build_mix(parse_spec(spec(sources, total_tokens=200 * SEQ)), str(tmp_path / "a"))
    web, code = m["sources"]
    assert (web["selected_instances"], code["selected_instances"]) == (160, 40)
    assert code["repeats"] == 2.0
    counts = np.bincount(np.load(tmp_path / "a" / "web.ids.npy"), minlength=75)
    assert counts.min() == 2 and counts.max() == 3 and counts.sum() == 160  # as even as possible
    budgets = {
        "seed": 1,
        "sequence_length": SEQ,
        "dtype": "uint32",
        "sources": [
            {"name": "web", "paths": sources["web"], "tokens": 10 * SEQ},
            {"name": "code", "paths": sources["code"], "tokens": "3e1"},  # YAML may hand numbers as strings
        ],
    }
    m = build_mix(parse_spec(budgets), str(tmp_path / "b"))
    assert [s["selected_instances"] for s in m["sources"]] == [10, 4]  # 30 tokens round to 4 instances of 8
    assert [s["requested_tokens"] for s in m["sources"]] == [80, 30]
    assert [s["realized_tokens"] for s in m["sources"]] == [80, 32]


def test_selection_is_deterministic_and_seeded(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    build_mix(parse_spec(spec(sources)), str(tmp_path / "one"))
    build_mix(parse_spec(spec(sources)), str(tmp_path / "two"))
    for name in ("mix.json", "web.ids.npy", "code.ids.npy"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    build_mix(parse_spec(spec(sources, seed=6)), str(tmp_path / "three"))
    assert not np.array_equal(np.load(tmp_path / "one" / "code.ids.npy"), np.load(tmp_path / "three" / "code.ids.npy"))
    a = open_dataset(mix=str(tmp_path / "one"), sequence_length=SEQ).fingerprint()
    assert a == open_dataset(mix=str(tmp_path / "two"), sequence_length=SEQ).fingerprint()
    assert a != open_dataset(mix=str(tmp_path / "three"), sequence_length=SEQ).fingerprint()


def test_select_instances_counts() -> None:
    rng = np.random.default_rng(0)
    ids = select_instances(10, 25, rng)
    assert len(ids) == 25 and sorted(np.bincount(ids).tolist()) == [2] * 5 + [3] * 5
    assert len(set(select_instances(10, 7, rng).tolist())) == 7


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shares": {"web": 0.5, "code": 0.2}}, r"the shares add up to 0.7, not 1"),
        ({"bogus": 1}, r"unknown keys \['bogus'\]"),
        ({"shares": {"we b": 0.8, "code": 0.2}}, r"sources\[0\]: name 'we b' must be letters"),
        ({"sequence_length": -1}, r"sequence_length: must be positive"),
        ({"seed": "abc"}, r"mix.yaml: seed: expected a non-negative integer, got 'abc'"),
        ({"seed": -3}, r"mix.yaml: seed: expected a non-negative integer, got -3"),
        ({"dtype": "int8"}, r"mix.yaml: dtype: expected uint16 or uint32, got 'int8'"),
    ],
)
def test_bad_specs(sources: dict[str, list[str]], change: dict[str, Any], message: str) -> None:
    s = dict(sources, **{"we b": sources["web"]})
    with pytest.raises(DataError, match=message):
        parse_spec(spec(s, **change), where="mix.yaml")


def test_bad_source_entries(sources: dict[str, list[str]]) -> None:
    base = spec(sources)
    both = dict(base, sources=[dict(base["sources"][0], tokens=5), base["sources"][1]])
    with pytest.raises(DataError, match=r"mix.yaml: sources\[0\] \(web\): give exactly one of share .* or tokens"):
        parse_spec(both, where="mix.yaml")
    dup = dict(base, sources=[base["sources"][0], dict(base["sources"][1], name="web")])
    with pytest.raises(DataError, match=r"sources\[1\]: source name 'web' is used twice"):
        parse_spec(dup)
    mixed = dict(base, sources=[base["sources"][0], {"name": "code", "paths": sources["code"], "tokens": 80}])
    with pytest.raises(DataError, match=r"some sources give a share and others a token budget"):
        parse_spec(mixed)
    nopaths = dict(base, sources=[{"name": "web", "share": 1.0}])
    with pytest.raises(DataError, match=r"sources\[0\] \(web\): paths is missing or empty"):
        parse_spec(nopaths)
    for key, value in (("paths", 5), ("label_mask_paths", 3), ("paths", ["a.npy", 7])):
        bad = dict(base, sources=[dict(base["sources"][0], **{key: value}), base["sources"][1]])
        with pytest.raises(
            DataError,
            match=rf"mix.yaml: sources\[0\] \(web\).{key}: expected a path or a list of paths \(strings\), got",
        ):
            parse_spec(bad, where="mix.yaml")
    with pytest.raises(DataError, match=r"sequence_length is missing"):
        parse_spec({k: v for k, v in base.items() if k != "sequence_length"})


def test_bad_sources_and_manifests(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    tiny = make_source(tmp_path / "tiny", "tiny", [5], 0)
    s = spec(dict(sources, tiny=tiny), shares={"web": 0.5, "tiny": 0.5})
    with pytest.raises(DataError, match=r"source tiny: its files hold no complete instance of 8 tokens"):
        build_mix(parse_spec(s), str(tmp_path / "m"))
    assert not (tmp_path / "m" / "mix.json").exists()
    missing = spec({"web": [str(tmp_path / "nope.npy")], "code": sources["code"]})
    with pytest.raises(DataError, match=r"source web: .*nope.npy: token file not found"):
        build_mix(parse_spec(missing), str(tmp_path / "m"))
    build_mix(parse_spec(spec(sources)), str(tmp_path / "ok"))
    with pytest.raises(DataError, match=r"the mix was built for sequence_length 8 but 16 was asked for"):
        open_dataset(mix=str(tmp_path / "ok"), sequence_length=16)
    with pytest.raises(DataError, match=r"dtype uint16 was requested but the mix manifest .* says uint32"):
        open_dataset(mix=str(tmp_path / "ok"), sequence_length=SEQ, dtype="uint16")
    with pytest.raises(DataError, match=r"nowhere/mix.json: mix manifest not found"):
        open_dataset(mix=str(tmp_path / "nowhere"), sequence_length=SEQ)
    # the token files changed after mixing
    np.arange(80, dtype=np.uint32).tofile(sources["code"][0])
    with pytest.raises(DataError, match=r"code-0.npy: the manifest says 161 tokens but the file holds 80"):
        open_dataset(mix=str(tmp_path / "ok"), sequence_length=SEQ)


def test_mix_through_config_order_and_inspect(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    spec_path = tmp_path / "mix.yaml"
    spec_path.write_text(yaml.safe_dump(spec(sources)))
    res = CliRunner().invoke(main, ["mix", str(spec_path), "--destination", str(tmp_path / "mix")])
    assert res.exit_code == 0, res.output
    assert "web" in res.output and "80.00%" in res.output and "79.79%" in res.output  # requested, realized
    cfg = {
        "seed": 2,
        "save_folder": str(tmp_path / "run"),
        "global_train_batch_size": 4,
        "model": {"max_sequence_length": SEQ},
        "data": {"mix": str(tmp_path / "mix")},
    }
    build_config_orders(cfg)
    report = inspect_batch(cfg, step=3, doc_index=DocIndex(str(tmp_path / "c")))
    perm = np.arange(94)
    np.random.Generator(np.random.PCG64(2)).shuffle(perm)
    code_ids = np.load(tmp_path / "mix" / "code.ids.npy")
    for inst in report.instances:
        assert inst.instance == perm[8 + inst.position]
        if inst.instance < 75:
            assert inst.source == "web" and inst.token_ids[0] // 1_000_000 == 1
        else:
            assert inst.source == "code"
            assert inst.token_ids[0] == 2_000_000 + int(code_ids[inst.instance - 75]) * SEQ
    manifest = json.loads((tmp_path / "mix" / "mix.json").read_text())
    assert manifest["totals"] == {"instances": 94, "tokens": 94 * SEQ}
    # stats of a mix takes the sequence length the mix was cut at
    res = CliRunner().invoke(main, ["stats", "--mix", str(tmp_path / "mix"), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["num_instances"] == 94 and got["sequence_length"] == SEQ


def test_label_masks_through_a_mix(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    mask = np.zeros(161, dtype=bool)
    mask[::3] = True
    mask.tofile(tmp_path / "code.mask")
    s = spec(sources)
    s["sources"][1]["label_mask_paths"] = [str(tmp_path / "code.mask")]
    build_mix(parse_spec(s), str(tmp_path / "mix"))
    ds = open_dataset(mix=str(tmp_path / "mix"), sequence_length=SEQ)
    ids = np.load(tmp_path / "mix" / "code.ids.npy")
    _, masks = ds.get_batch([0, 75])
    assert masks is not None
    assert masks[0].all()  # web has no masks: every token is a target
    np.testing.assert_array_equal(masks[1], mask[int(ids[0]) * SEQ : int(ids[0]) * SEQ + SEQ])


def test_example_spec_parses() -> None:
    example = yaml.safe_load((Path(__file__).resolve().parents[3] / "configs" / "mix_example.yaml").read_text())
    parsed = parse_spec(example, where="configs/mix_example.yaml")
    assert [s.name for s in parsed.sources] == ["web", "code"] and parsed.total_tokens == 2_000_000


def test_interrupted_rebuild_leaves_no_manifest(
    tmp_path: Path, sources: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rebuild killed after rewriting the selections must not leave the old mix.json serving new tokens."""
    from olmo_data.dataset import mixture

    dest = tmp_path / "mix"
    build_mix(parse_spec(spec(sources, seed=1, shares={"web": 0.5, "code": 0.5})), str(dest))

    def killed(*args: Any, **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(mixture, "write_json_atomic", killed)
    with pytest.raises(KeyboardInterrupt):
        build_mix(parse_spec(spec(sources, seed=2, shares={"web": 0.5, "code": 0.5})), str(dest))
    with pytest.raises(DataError, match=r"mix/mix.json: mix manifest not found"):
        open_dataset(mix=str(dest), sequence_length=SEQ)


def test_rewritten_selection_is_refused(tmp_path: Path, sources: dict[str, list[str]]) -> None:
    dest = tmp_path / "mix"
    manifest = build_mix(parse_spec(spec(sources, shares={"web": 0.5, "code": 0.5})), str(dest))
    assert len(open_dataset(mix=str(dest), sequence_length=SEQ)) == manifest["totals"]["instances"]
    web = dest / "web.ids.npy"
    ids = np.load(web)
    other = np.sort(np.setdiff1d(np.arange(75), ids)[: len(ids)])  # same length and range, other instances
    assert len(other) == len(ids) and not np.array_equal(other, ids)
    np.save(web, other.astype(np.int64))
    with pytest.raises(
        DataError,
        match=r"web.ids.npy: the selection of source web has sha256 .* that .*mix.json records; it was "
        r"rewritten after the mix was built .*rebuild the mix with `olmo-data mix",
    ):
        open_dataset(mix=str(dest), sequence_length=SEQ)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ids: np.concatenate([[-1], ids[1:]]), r"not sorted instance ids from 0"),
        (lambda ids: ids[::-1].copy(), r"not sorted instance ids from 0"),
        (lambda ids: ids.astype(np.float64), r"a selection is a 1-D array of instance ids, not float64"),
    ],
)
def test_selection_ids_are_checked_even_when_their_sha256_agrees(
    tmp_path: Path, sources: dict[str, list[str]], change: Any, message: str
) -> None:
    """A selection with an id of -1 would read the previous source's last instance; its recorded sha256 only
    says the file is the one written, so the ids themselves are checked too."""
    import hashlib

    dest = tmp_path / "mix"
    build_mix(parse_spec(spec(sources, shares={"web": 0.5, "code": 0.5})), str(dest))
    manifest = json.loads((dest / "mix.json").read_text())
    second = manifest["sources"][1]
    path = dest / second["selection"]
    np.save(path, change(np.load(path)))
    second["selection_sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (dest / "mix.json").write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=rf"{second['selection']}: .*{message}"):
        open_dataset(mix=str(dest), sequence_length=SEQ)


def test_mix_cli_flags_and_help() -> None:
    res = CliRunner().invoke(main, ["mix", "--help"])
    assert res.exit_code == 0
    text = " ".join(res.output.split())  # click wraps the help
    assert "configs/mix_example.yaml" in text and "docs/data.md (its section on mix)" in text
    assert "-d," not in res.output
    res = CliRunner().invoke(main, ["mix", "spec.yaml", "-d", "out"])
    assert res.exit_code == 2 and "No such option '-d'" in res.output
