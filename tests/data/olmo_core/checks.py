"""What the OLMo-core dataset tests (packed, interleaved, VSL, composable, OLMo 3 recipes) check the same way, kept
here once so that a change to a command's output is followed in one place (tests only).

* `write_metadata`: the tokenize-style .csv.gz beside a token file, for the commands' document lookups.
* `inspected_rows`: `inspect-batch --json` on each rank at some steps, its epoch, ids and tokens checked against
  OLMo-core's loader; each test then checks what its dataset kind adds (pieces, masks, doc_lens).
* `check_written_and_kept`: build-order writes OLMo-core's own files and orders elsewhere, and keeps them in the run's
  own work_dir as identical.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from click.testing import CliRunner

from olmo_cli.main import main as data_main


def write_metadata(token_path: str, lengths: list[int], doc_prefix: str, source: str) -> None:
    """`start,end,id,source,line` of each document of `lengths` tokens (end to end from token 0), in the .csv.gz
    beside `token_path`, as tokenize writes it; ids are `{doc_prefix}-{i}`."""
    ends = np.cumsum(lengths)
    with gzip.open(token_path[: -len(".npy")] + ".csv.gz", "wt") as meta:
        for i, (a, b) in enumerate(zip([0, *ends[:-1]], ends, strict=True)):
            meta.write(f"{a},{b},{doc_prefix}-{i},{source},{i + 1}\n")


def inspected_rows(
    config_json: str, reference: dict[int, list[Any]], steps: list[int]
) -> Iterator[tuple[Any, int, Any]]:
    """(OLMo-core's step on the rank, row, our instance) for every row of `inspect-batch --json` at each of
    `steps` on each rank of `reference` (OLMo-core's loader's steps per rank), once its epoch, instance ids and
    the row's tokens are checked equal to OLMo-core's."""
    world = len(reference)
    for step in steps:
        for rank in range(world):
            theirs = reference[rank][step - 1]
            args = ["inspect-batch", config_json, "--step", str(step), "--rank", str(rank)]
            result = CliRunner().invoke(
                data_main, [*args, "--world-size", str(world), "--json"], catch_exceptions=False
            )
            assert result.exit_code == 0, result.output
            got = json.loads(result.output)
            assert got["epoch"] == theirs.epoch and [i["instance"] for i in got["instances"]] == theirs.index.tolist()
            for row, inst in enumerate(got["instances"]):
                np.testing.assert_array_equal(inst["token_ids"], theirs.input_ids[row])
                yield theirs, row, inst


def check_written_and_kept(
    config_json: str, work: Path, other: Path, theirs: dict[str, bytes], files_in: Callable[[Path], dict[str, bytes]]
) -> None:
    """build-order --destination `other` writes OLMo-core's files (`files_in(other)` is `theirs`, what OLMo-core
    wrote in its work_dir `work`) and the epochs' order files as OLMo-core wrote them; build-order in the run's
    own work_dir finds each of `theirs` identical and keeps it."""
    runner = CliRunner()
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3", "--destination", str(other)])
    assert result.exit_code == 0, result.output
    assert files_in(other) == theirs
    orders = sorted(f for f in os.listdir(work) if f.startswith("global_indices"))
    assert sorted(f for f in os.listdir(other) if f.startswith("global_indices")) == orders
    for name in orders:
        assert (other / name).read_bytes() == (work / name).read_bytes()
    result = runner.invoke(data_main, ["build-order", config_json, "--epochs", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("identical to OLMo-core's (kept)") == len(theirs)
