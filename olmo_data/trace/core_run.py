"""`trace` of an OLMo-core run: which of its training steps (and ranks) held a document or a passage.

The targets are found as for our runs (`find.find_targets`: the tokenize metadata's document index, or a scan of
the token files) over the distinct token files of OLMo-core's dataset; each target's tokens are then the
OLMo-core instances holding them (`olmo_core.instances_holding`: every occurrence of a file in a mixture, a
padded dataset's one instance per document), and those instances the steps of each epoch's order that read them
(`olmo_core.trained_at`, the batch-size schedule included). Steps and epochs are counted as OLMo-core counts
them, from 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from olmo_data.dataset import InstanceSource, TokenFile
from olmo_data.errors import DataError
from olmo_data.io import file_size
from olmo_data.olmo_core import OlmoCoreData, data_fingerprint, instances_holding, run_length, trained_at
from olmo_data.run import Stage
from olmo_data.trace.find import Hit, TraceReport, find_targets


@dataclass
class CoreFiles:
    """OLMo-core's distinct token files in the shape the target finders read (`files`)."""

    files: list[TokenFile]


def trace_olmo_core(
    core: OlmoCoreData,
    ids: Sequence[str],
    *,
    source_glob: str | None = None,
    text: str | None = None,
    tokens: str | None = None,
    tokenizer: str | None = None,
    steps: tuple[int, int] | None = None,
    world_size: int | None = None,
    processes: int = 1,
    progress: bool | None = None,
) -> TraceReport:
    """Every (step, position) of OLMo-core's run whose instance holds a token of a target, within `steps`
    (1-based, inclusive; default the run's trainer.max_duration)."""
    if core.run.dtype not in ("uint16", "uint32") and (text is not None or tokens is not None):
        raise DataError(f"--text/--tokens: token files of dtype {core.run.dtype} are not searched; trace documents")
    paths = list(dict.fromkeys(core.dataset.paths))
    files = [TokenFile(p, core.run.dtype, file_size(p) // core.dataset.itemsize) for p in paths]
    finder = cast(InstanceSource, CoreFiles(files))  # find_targets reads only `files`
    targets, scan = find_targets(
        finder,
        ids,
        source_glob=source_glob,
        text=text,
        tokens=tokens,
        tokenizer=tokenizer,
        processes=processes,
        progress=progress,
        use_index=False,
    )
    if steps is None:
        last = run_length(core)
        if last is None:
            raise DataError(f"{core.run.source}: its trainer section gives no max_duration; pass --steps A..B")
        steps = (1, last)
    first, last = steps
    if first < 1 or last < first:
        raise DataError(f"--steps {first}..{last}: expected 1 <= A <= B")
    per_batch = core.slot(first).instances
    if world_size is not None and (world_size < 1 or per_batch % world_size):
        raise DataError(f"--world-size {world_size} must divide the global batch size {per_batch}")
    holding = [instances_holding(core, paths[t.file_index], t.start, t.end) for t in targets]
    found = trained_at(core, [h[0] for held in holding for h in held], first, last, world_size or 1)
    L = core.run.sequence_length
    hits: list[Hit] = []
    for t, (target, held) in enumerate(zip(targets, holding, strict=True)):
        for instance, start, length, offset in held:  # file tokens [start, start + length) from position `offset`
            lo, hi = max(target.start, start), min(target.end, start + length)
            if hi <= lo:
                continue
            supervised = None
            if core.run.label_mask_paths is not None:
                _, masks = core.dataset.get_batch(np.array([instance]))
                supervised = (
                    int(masks[0][lo - start + offset : hi - start + offset].sum()) if masks is not None else None
                )
            for at in found[instance]:
                hits.append(
                    Hit(
                        target=t,
                        step=at.step,
                        epoch=at.epoch,
                        batch_in_epoch=core.slot(at.step).batch,
                        position=at.position,
                        rank=at.rank if world_size else None,
                        instance=instance,
                        path=paths[target.file_index],
                        instance_start=lo - start + offset,
                        instance_end=hi - start + offset,
                        target_start=lo - target.start,
                        target_end=hi - target.start,
                        supervised=supervised,
                    )
                )
    hits.sort(key=lambda h: (h.step, h.position, h.target))
    trained = {h.target for h in hits}
    return TraceReport(
        targets=targets,
        hits=hits,
        first_step=first,
        last_step=last,
        global_batch_size=per_batch,
        sequence_length=L,
        world_size=world_size,
        scan=scan,
        not_trained=[t for t in range(len(targets)) if t not in trained],
    )


def olmo_core_stage(core: OlmoCoreData, config: str, first: int, last: int) -> Stage:
    """The OLMo-core run as the one stage of its trace (its lineage is not followed: OLMo-core records none)."""
    return Stage(
        index=0,
        parent_of=None,
        depth=0,
        source="run",
        run_name=str(core.raw.get("run_name") or core.raw.get("trainer", {}).get("save_folder") or "olmo-core"),
        config=config,
        checkpoint=None,
        given=None,
        first_step=first,
        last_step=last,
        checkpoint_step=None,
        tokens_seen=None,
        batch_tokens=core.slot(first).instances * core.run.sequence_length,
        data_fingerprint=data_fingerprint(core),
    )
