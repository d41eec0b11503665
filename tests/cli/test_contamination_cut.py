"""`olmo-data contamination` answers the same whichever search finds the spans: a text the data holds in more places
than --max-places is listed by its first places over the whole run (by token file, in the run's order of data paths,
then offset), with the count of all of them, by the scan, the suffix index and `auto` whichever way it chooses; the
JSON is then the same bytes but for each stage's `index`, `search_seconds` and `estimates`, and the text output says
where the list was cut. A small cap on a tiny run whose two token files repeat one instance's text makes the case.

(Before, the scan kept the first places of each token file and the index the first of the run: with 30 and 40
copies and a cap of 25 the scan listed 50 places in both files, the index 25 in the first, so their documents and
steps differed and `auto` answered by timing.)"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from olmo_cli.main import main
from olmo_data.dataset.order import build_config_orders
from olmo_data.tokenize import TokenizeOptions, tokenize
from olmo_data.trace import EvalInstance

TEXT = "Question: Which tool opens a sealed paint can?\nAnswer: A flat screwdriver pried under the lid's rim."
OTHER = "Question: How do you keep bread fresh for longer? Answer: wrap it in a cloth and keep it somewhere cool."
COPIES = (30, 40)  # of TEXT in the first and the second token file
HOW = ("index", "search_seconds", "estimates")  # how a stage was searched: the only keys that may differ


@pytest.fixture(scope="module")
def run(demo_tokenizer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Two token files (one per token directory), each TEXT repeated among other documents; two configs that
    list them in both orders; and a suffix index of both files."""
    root = tmp_path_factory.mktemp("contamination-cut")
    dirs = []
    for n, copies in enumerate(COPIES):
        shard = root / f"docs{n}.jsonl.gz"
        with gzip.open(shard, "wt") as f:
            for d in range(copies):
                f.write(json.dumps({"id": f"f{n}-{d}", "text": TEXT, "source": "toy"}) + "\n")
                f.write(json.dumps({"id": f"f{n}-other-{d}", "text": f"{OTHER} ({d})", "source": "toy"}) + "\n")
        tokenize([str(shard)], root / f"tokens{n}", TokenizeOptions(tokenizer=demo_tokenizer))
        dirs.append(str(root / f"tokens{n}"))
    configs = {}
    for name, paths in (("forward", dirs), ("backward", dirs[::-1])):
        cfg = {
            "seed": 5,
            "save_folder": str(root / f"run-{name}"),
            "global_train_batch_size": 2,
            "max_duration": "1ep",
            "model": {"max_sequence_length": 32},
            "data": {"paths": paths},
        }
        (root / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        build_config_orders(cfg, epochs=1)
        configs[name] = str(root / f"{name}.yaml")
    res = CliRunner().invoke(main, ["index", configs["forward"]])
    assert res.exit_code == 0, res.output
    return configs


@pytest.fixture(autouse=True)
def one_task(monkeypatch: pytest.MonkeyPatch) -> None:
    """The task `--tasks toy` names: one instance whose two texts are TEXT and a text sharing its first half."""
    instance = EvalInstance("toy", 0, "toy-0", [TEXT, "Something else: " + TEXT[:60]], 0)
    monkeypatch.setattr("olmo_train.train.eval_instances", lambda label, limit: [instance])


def contamination(config: str, *args: str) -> tuple[dict[str, Any], str]:
    """The JSON report, and its bytes less the keys that say how each stage was searched."""
    res = CliRunner().invoke(main, ["contamination", config, "--tasks", "toy", "--json", *args])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    answer = json.loads(res.output)
    for stage in answer["stages"]:
        for key in HOW:
            stage.pop(key)
    return report, json.dumps(answer)


def searched_all_ways(config: str, monkeypatch: pytest.MonkeyPatch, *args: str) -> dict[str, Any]:
    """The report by --search scan, index and auto (made to choose each way): asserted the same answer."""
    by_scan, scan_bytes = contamination(config, "--search", "scan", *args)
    by_index, index_bytes = contamination(config, "--search", "index", *args)
    assert [s["index"] for s in by_scan["stages"]] == [False] and [s["index"] for s in by_index["stages"]] == [True]
    assert scan_bytes == index_bytes
    monkeypatch.setattr("olmo_data.trace.contamination.PROBE_TEXTS", 1)  # auto: probe the index on one text ...
    for scan_seconds, by in ((0.0, False), (1e9, True)):  # ... and take the scan, then the index
        monkeypatch.setattr("olmo_data.trace.contamination.estimate_scan", lambda *a, s=scan_seconds: s)
        by_auto, auto_bytes = contamination(config, *args)
        assert by_auto["stages"][0]["index"] is by and by_auto["stages"][0]["estimates"]
        assert auto_bytes == scan_bytes
    return by_scan


def the_instance(report: dict[str, Any]) -> dict[str, Any]:
    (task,) = report["tasks"]
    (found,) = task["contaminated_instances"]
    return found  # type: ignore[no-any-return]


def files_of(instance: dict[str, Any], text: int) -> list[str]:
    """The token file (f0, f1: its documents' ids begin so) of each listed place of the instance's text, in the
    listed order."""
    return [o["documents"][0]["id"].split("-")[0] for o in instance["occurrences"] if o["text"] == text]


def test_a_cut_list_is_the_same_by_scan_index_and_auto(run: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    report = searched_all_ways(run["forward"], monkeypatch, "--max-places", "25")
    assert report["max_places"] == 25 and "by token file" in report["places_listed"]
    found = the_instance(report)
    assert [(s["text"], s["places"], s["listed"]) for s in found["spans"]] == [(0, 70, 25), (1, 70, 25)]
    assert found["places"] == 140 and found["listed"] == 50
    assert files_of(found, 0) == ["f0"] * 25  # the first 25 of the run: all in its first token file
    starts = [o["file_start"] for o in found["occurrences"] if o["text"] == 0]
    assert starts == sorted(starts)  # by offset
    assert found["documents"][:2] == ["f0-0", "f0-1"] and not any(d.startswith("f1-") for d in found["documents"])

    across = the_instance(searched_all_ways(run["forward"], monkeypatch, "--max-places", "45"))
    assert files_of(across, 0) == ["f0"] * 30 + ["f1"] * 15  # the cut in the second file: its first 15

    res = CliRunner().invoke(main, ["contamination", run["forward"], "--tasks", "toy", "--max-places", "25"])
    assert res.exit_code == 0, res.output
    assert "; 50 of 140 places listed: the first 25 of each span by file and offset" in res.output


def test_the_cut_follows_the_runs_order_of_data_paths(run: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The same files listed the other way round: the first places are the second directory's, by either search
    (its index is the same files' index, found beside them)."""
    found = the_instance(searched_all_ways(run["backward"], monkeypatch, "--max-places", "25"))
    assert files_of(found, 0) == ["f1"] * 25


def test_an_uncut_list_is_the_same_too(run: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    report = searched_all_ways(run["forward"], monkeypatch)
    assert report["max_places"] == 1000
    found = the_instance(report)
    assert [(s["places"], s["listed"]) for s in found["spans"]] == [(70, 70), (70, 70)]
    assert files_of(found, 0) == ["f0"] * 30 + ["f1"] * 40
    assert found["steps"]["0"]  # traced to the steps that trained on it
    res = CliRunner().invoke(main, ["contamination", run["forward"], "--tasks", "toy"])
    assert res.exit_code == 0 and "places listed" not in res.output, res.output


def test_no_place_listed_still_counts_them(run: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    found = the_instance(searched_all_ways(run["forward"], monkeypatch, "--max-places", "0"))
    assert found["places"] == 140 and found["listed"] == 0 and found["occurrences"] == [] and found["documents"] == []
    res = CliRunner().invoke(main, ["contamination", run["forward"], "--tasks", "toy", "--max-places", "0"])
    assert res.exit_code == 0, res.output
    assert "(no place listed); steps not traced; 0 of 140 places listed" in res.output


def test_a_negative_max_places_is_one_line(run: dict[str, str]) -> None:
    res = CliRunner().invoke(main, ["contamination", run["forward"], "--tasks", "toy", "--max-places", "-1"])
    assert res.exit_code == 2, res.output
    assert res.output.strip() == "error: --max-places -1: expected a number of places, 0 or more"
