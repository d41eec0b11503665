"""`trace` across stages: which steps of a run, and of every run whose checkpoint it grew from, trained a document.

A stage-2 run (mid-training, an anneal) loads a stage-1 checkpoint and trains on other data; its weights carry
both. So the trace of a stage-2 config is the trace of its own steps, then, for each ancestor stage (see
`olmo_data.run.lineage`), the trace of that stage's run, read from its checkpoint's config.yaml, limited to the steps up
to the checkpoint it handed on: a later stage-1 step never reached these weights. Each stage is traced exactly as
`trace` traces a run on its own (targets found in that stage's own data), so its hits are those of `olmo-data
trace ANCESTOR_CONFIG --steps 1..N`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from olmo_data.errors import DataError
from olmo_data.run import Stage, format_lineage, read_run, read_stage_config, stage_line
from olmo_data.trace.find import (
    TraceReport,
    check_target_options,
    find_targets,
    format_trace,
    parse_steps,
    read_ids,
    trace_run,
)


@dataclass
class StageTrace:
    stage: Stage
    report: TraceReport | None  # None: the stage was not traced (see stage.note / why)
    why: str | None = None  # why not, beyond the stage's own note (its data cannot be read, say)


@dataclass
class ChainTrace:
    """The traced run's own report (what `trace` alone gives) and one per stage, the run's first."""

    stages: list[StageTrace]

    @property
    def own(self) -> TraceReport:
        report = self.stages[0].report
        assert report is not None  # the run asked about is always traced
        return report

    def to_json(self) -> dict[str, Any]:
        """Today's trace JSON of the run itself, plus `stages` (each with its run, steps, tokens and report) and
        `tokens_total`."""
        return self.own.to_json() | {
            "stages": [
                s.stage.to_json()
                | {"not_traced": s.why or s.stage.note, "report": s.report.to_json() if s.report else None}
                for s in self.stages
            ],
            "tokens_total": sum(s.stage.tokens_trained or 0 for s in self.stages),
        }


def trace_chain(
    config: str,
    *,
    document_ids: Sequence[str] = (),
    document_list: str | None = None,
    source_glob: str | None = None,
    text: str | None = None,
    tokens: str | None = None,
    tokenizer: str | None = None,
    steps: str | None = None,
    world_size: int | None = None,
    order: str | None = None,
    processes: int = 1,
    progress: bool | None = None,
    lineage: bool = True,
    index_dir: str | None = None,
    use_index: bool = True,
) -> ChainTrace:
    """`trace` of `config` with the targets named as `olmo-data trace` takes them: documents by id
    (`document_ids`, and a `document_list` file of ids, one per line), every document of source files matching
    `source_glob`, or one passage, as `text` (encoded with the data's own tokenizer, or `tokenizer`) or as `tokens`
    ("ID,ID,..."); `steps` is "A..B" (1-based, inclusive) or one step "N", default the whole run. With `lineage`,
    also every ancestor stage's trace, up to the step of the checkpoint it handed on. `steps`, `order` apply to
    the run itself; ancestors use their own configs' orders. A document id must be found in some stage's data; a
    stage without it simply has no hits. A passage is looked up in each stage's suffix index where it has one
    (`use_index`; `index_dir` is the run's own, ancestors' are found beside their token files)."""
    ids = read_ids(document_ids, document_list)
    check_target_options(ids, source_glob, text, tokens)
    run = read_run(config, order=order)
    first_last = parse_steps(steps)
    last = first_last[1] if first_last else run.run_steps()
    if last is None:
        raise DataError(f"{config}: the config gives no max_duration (trainer.max_duration); pass --steps A..B")
    stages = run.lineage(last) if lineage else []
    many = len(stages) > 1
    find = dict(
        source_glob=source_glob, text=text, tokens=tokens, tokenizer=tokenizer, processes=processes, use_index=use_index
    )
    targets, scan = find_targets(
        run.target_source(),
        ids,
        progress=progress,
        missing_ok=many,
        index_dir=index_dir,
        **find | {"use_index": use_index and run.finds_with_index},  # type: ignore[arg-type]
    )
    own_steps = first_last or ((stages[0].first_step if stages else 1), last)
    report = trace_run(run, targets, steps=own_steps, world_size=world_size)
    report.scan = scan
    if not stages:
        return ChainTrace([StageTrace(run.stage(own_steps[0], own_steps[1]), report)])
    stages[0].first_step, stages[0].last_step = own_steps
    out = [StageTrace(stages[0], report)]
    found = {t.name for t in targets}
    for stage in stages[1:]:
        if not stage.traceable:
            out.append(StageTrace(stage, None))
            continue
        try:
            stage_cfg = read_stage_config(str(stage.config))
            stage_run = read_run(stage_cfg)
            if stage.data_fingerprint and stage_run.data_fingerprint() != stage.data_fingerprint:
                raise DataError(
                    f"its data ({stage_cfg.data.mix or ', '.join(stage_cfg.data.paths)}) now has fingerprint "
                    f"{stage_run.data_fingerprint()}, not the "
                    f"{stage.data_fingerprint} it trained on: the files changed or moved since"
                )
            stage_targets, stage_scan = find_targets(stage_run.target_source(), ids, missing_ok=True, **find)  # type: ignore[arg-type]
            stage_report = trace_run(
                stage_run, stage_targets, steps=(stage.first_step, int(stage.last_step or 0)), world_size=world_size
            )
        except DataError as e:
            out.append(StageTrace(stage, None, f"not traced: {e}"))
            continue
        stage_report.scan = stage_scan
        found |= {t.name for t in stage_targets}
        out.append(StageTrace(stage, stage_report))
    missing = [i for i in ids if i not in found]
    if missing and not any(s.report is None and (s.stage.note or s.why) for s in out[1:]):  # else: maybe there
        shown = ", ".join(repr(m) for m in missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise DataError(
            f"document id {shown} not found in the metadata of the token files of any stage "
            f"({', '.join(repr(s.stage.run_name) for s in out)}); check the id"
        )
    if source_glob is not None and not any(s.report and s.report.targets for s in out):
        raise DataError(f"no document of any stage's token files comes from a source file matching {source_glob!r}")
    return ChainTrace(out)


def format_chain(chain: ChainTrace, *, max_targets: int = 20) -> str:
    """The run's own trace as `trace` prints it; where it grew from other stages, each stage's trace after it,
    headed by the stage's run, config and checkpoint, and the tokens per stage and in total."""
    text = format_trace(chain.own, max_targets=max_targets)
    if len(chain.stages) == 1:
        return text
    lines = [text]
    if not chain.own.targets and not chain.own.scan:
        lines.append("(no target is in this run's own data; the stages it grew from follow)")
    lines += ["", "lineage (the stages whose steps shaped these weights):"]
    lines += ["  " + line for line in format_lineage([s.stage for s in chain.stages]).splitlines()]
    for s in chain.stages[1:]:
        lines += ["", "== " + stage_line(s.stage)]
        if s.report is not None:
            lines += ["  " + line for line in format_trace(s.report, max_targets=max_targets).splitlines()]
        elif s.why:
            lines.append("  " + s.why)
    return "\n".join(lines)
