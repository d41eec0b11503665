"""The stages whose training shaped a run's weights: the run itself, the checkpoint it started from, that
checkpoint's own parents, and so on (mid-training, anneals, soups, imports).

`trace` and `inspect-batch` answer questions about one run's steps; a stage-2 run that loaded a stage-1 checkpoint
also carries what stage 1 trained on, up to the step of that checkpoint (later stage-1 steps never reached these
weights). The chain is read from the files the trainer writes, never through the trainer (no torch here):

  - a checkpoint's `trainer_state.json` may hold `lineage`: a list of parent records, each
    {source, given, resolved, run_name, data_fingerprint, step, tokens_seen, weight, lineage: [...]}
    ([] for a fresh run, one for a run started from load_path, N for a soup), and in newer checkpoints
    `counters`: "continued" or "restarted", whether the child kept the parent's counters (older records: guessed
    from the child's config);
  - a checkpoint directory also holds `config.yaml`, the run's resolved config (what `read_stage_config` reads).

Older checkpoints have no `lineage`; then the chain is rebuilt from configs: a config's `load_path` names the
parent checkpoint, whose `config.yaml` names its own, and so on.

A run that loaded a checkpoint without restarting (no `reset_trainer_state`, `restore_dataloader` not false) on
the same data, seed and batch size just continues the parent's run: its steps 1..N are the parent's, with the
same order, so it is one stage with it, not two. A parent that cannot be read (deleted, remote without access) is
kept as a stage with a note saying so; what its record says (run, step, tokens) is still shown.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from olmo_data.config import TrainConfig, read_run_config
from olmo_data.dataset import open_from_config, run_steps
from olmo_data.errors import DataError, shown
from olmo_data.io import is_remote, read_bytes
from olmo_data.run.layout import CONFIG, STEP_DIR, TRAINER_STATE, join, latest_checkpoint

SOURCES = ("checkpoint", "import-hf", "import-olmo", "import-olmo-core", "soup")
TRAINED = ("checkpoint", "soup")  # records of a trained run's checkpoint (loaded, or averaged into a soup)
COUNTERS = (None, "continued", "restarted")  # a record's optional `counters` key (absent in older records)
MAX_DEPTH = 64  # a chain longer than this is a loop in the records


@dataclass
class Stage:
    """One run whose steps [first_step, last_step] shaped the weights (or a soup/import that trained none)."""

    index: int
    parent_of: int | None  # the stage that loaded this one's weights; None for the run asked about
    depth: int
    source: str  # "run" (the config asked about), or the record's source: checkpoint, soup, import-hf, import-olmo
    run_name: str
    config: str | None  # the config its steps are read from (an ancestor's: its checkpoint's config.yaml)
    checkpoint: str | None  # the parent checkpoint, resolved (a local directory or a URL)
    given: str | None  # ... as the child's load_path wrote it
    first_step: int
    last_step: int | None  # inclusive; None: unknown (no max_duration)
    checkpoint_step: int | None  # the checkpoint's step in its run's own count
    tokens_seen: int | None  # as the checkpoint records it
    batch_tokens: int | None  # global batch size x sequence length
    data_fingerprint: str | None
    weight: float | None = None  # a soup parent's weight
    note: str | None = None  # why its steps cannot be traced, where they cannot
    also_loaded_by: list[int] = field(default_factory=list)  # other stages that loaded this same checkpoint
    planned: bool = False  # the run asked about: last_step is its planned length (no checkpoint of it saved yet)
    identity: tuple[str, str, int, str] | None = field(default=None, repr=False)  # checkpoint_identity of its record

    @property
    def steps(self) -> int:
        return max(0, self.last_step - self.first_step + 1) if self.last_step is not None else 0

    @property
    def tokens_trained(self) -> int | None:
        """Tokens this stage trained into the weights: its steps x its batch tokens (or, with no config to read,
        the tokens its checkpoint says it had seen)."""
        if self.batch_tokens is not None and self.last_step is not None:
            return self.steps * self.batch_tokens
        return self.tokens_seen

    @property
    def traceable(self) -> bool:
        return self.note is None and self.config is not None and self.steps > 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self) | {"steps": self.steps, "tokens_trained": self.tokens_trained}
        out.pop("identity")
        return out


def checkpoint_identity(rec: dict[str, Any]) -> tuple[str, str, int, str]:
    """What makes two parent records the same weights: run, data fingerprint, step and the save folder (a
    checkpoint's stepN/ and stepN-unsharded/ copies are one checkpoint; elsewhere the directory itself), so a
    shared ancestor reached through both copies counts once."""
    resolved = str(rec.get("resolved") or "").rstrip("/")
    folder, _, name = resolved.rpartition("/")
    where = folder if STEP_DIR.match(name) else resolved
    return (str(rec.get("run_name") or ""), str(rec.get("data_fingerprint") or ""), int(rec.get("step") or 0), where)


def counters_continued(rec: dict[str, Any]) -> bool | None:
    """A record's `counters` key ("continued": the child kept the parent's step and token counters; "restarted":
    it counted from zero); None for records written before the key, whose readers guess as they did."""
    value = rec.get("counters")
    return None if value is None else value == "continued"


def read_lineage(
    config_path: str, cfg: TrainConfig | None = None, *, fingerprint: str | None = None, last_step: int | None = None
) -> list[Stage]:
    """The stages of the run `config_path` describes: [the run itself, its parents, their parents, ...], each
    parent after the stage that loaded it. `fingerprint` is the run's data fingerprint (to tell a plain resume
    from a new stage) and `last_step` its last step (default: unknown)."""
    cfg = cfg if cfg is not None else read_stage_config(config_path)
    stages = [run_stage(config_path, cfg, 1, last_step, fingerprint)]
    records = _own_records(config_path, cfg)
    _attach(stages, stages[0], cfg, records, fingerprint, [os.path.abspath(config_path)])
    return stages


def run_stage(
    config_path: str, cfg: TrainConfig, first_step: int, last_step: int | None, fingerprint: str | None
) -> Stage:
    """The run `config_path` describes, as the first stage (index 0), steps [first_step, last_step]."""
    return Stage(
        index=0,
        parent_of=None,
        depth=0,
        source="run",
        run_name=cfg.run_name,
        config=config_path,
        checkpoint=None,
        given=None,
        first_step=first_step,
        last_step=last_step,
        checkpoint_step=None,
        tokens_seen=None,
        batch_tokens=_batch_tokens(cfg),
        data_fingerprint=fingerprint,
    )


def lineage_of_config(config_path: str) -> list[Stage]:
    """`read_lineage` with the run's data fingerprint and length read from its data (`olmo-data lineage`); data
    that cannot be opened leaves them unknown rather than failing the summary."""
    cfg = read_stage_config(config_path)
    fingerprint, last, planned = None, None, False
    try:
        source = open_from_config(cfg)
        fingerprint = source.fingerprint()
        last = run_steps(cfg, len(source))
    except DataError:
        pass
    if cfg.stop_at is not None and last is not None:
        last = min(last, cfg.stop_at)  # the trainer stops there (with a checkpoint)
    beside = os.path.join(os.path.dirname(config_path), TRAINER_STATE)  # a checkpoint's own config.yaml: its step
    latest = latest_checkpoint(cfg.save_folder)
    here = not is_remote(config_path) and os.path.isfile(beside)
    state = beside if here else latest and join(str(latest), TRAINER_STATE)
    step = _json(state).get("step") if state else None
    if isinstance(step, int) and not isinstance(step, bool):
        last = step  # what the run has trained so far, not what it plans
    elif last is not None:
        planned = True
    stages = read_lineage(config_path, cfg, fingerprint=fingerprint, last_step=last)
    stages[0].planned = planned
    return stages


def restarts(cfg: TrainConfig) -> bool:
    """Whether a run that loads a checkpoint counts its steps from 1 on its own data (OLMo's `reset_trainer_state`,
    or `restore_dataloader: false`), rather than continuing the checkpoint's run."""
    return cfg.reset_trainer_state or not cfg.restore_dataloader


def _attach(
    stages: list[Stage],
    child: Stage,
    child_cfg: TrainConfig | None,
    records: list[dict[str, Any]],
    child_fingerprint: str | None,
    seen: list[str],
) -> None:
    """Add a stage for each parent record of `child` (recursively); a plain resume merges into `child`."""
    if len(seen) > MAX_DEPTH:
        raise DataError(f"{seen[-1]}: the lineage is more than {MAX_DEPTH} stages deep; do its records loop?")
    for rec in records:
        parent_cfg, parent_config, note = _read_parent(rec)
        key = str(rec["resolved"])
        if key in seen:
            raise DataError(f"{key}: the lineage loops back to this checkpoint; its records are damaged")
        identity = checkpoint_identity(rec)
        shared = next((s for s in stages[1:] if s.identity == identity), None)
        if shared is not None:  # a common ancestor (a soup's anneals' stage 1): its steps and tokens count once
            shared.also_loaded_by.append(child.index)
            continue
        recorded = counters_continued(rec)
        continued = recorded if recorded is not None else child_cfg is not None and not restarts(child_cfg)
        if (
            rec["source"] == "checkpoint"
            and int(rec["step"]) > 0
            and child_cfg is not None
            and continued
            and _same_order(rec, parent_cfg, child_cfg, child_fingerprint)
        ):  # a plain resume: the child's own steps 1..N are the parent's, in the same order
            if parent_cfg is not None or rec.get("lineage") is not None:
                grand = _records_of(rec, parent_config, parent_cfg)
                _attach(stages, child, parent_cfg, grand, rec.get("data_fingerprint"), [*seen, key])
            continue
        if rec["source"] == "checkpoint" and child_cfg is not None and continued:
            child.first_step = int(rec["step"]) + 1  # continued on other data (force_load): later steps only
        traced = rec["source"] in TRAINED and int(rec["step"]) > 0
        stage = Stage(
            index=len(stages),
            parent_of=child.index,
            depth=child.depth + 1,
            source=str(rec["source"]),
            run_name=str(rec.get("run_name") or (parent_cfg.run_name if parent_cfg else None) or "(unknown)"),
            config=parent_config if parent_cfg is not None else None,
            checkpoint=key,
            given=None if rec.get("given") is None else str(rec["given"]),
            first_step=1,
            last_step=int(rec["step"]) if traced else 0,
            checkpoint_step=int(rec["step"]),
            tokens_seen=rec.get("tokens_seen"),
            batch_tokens=_batch_tokens(parent_cfg) if parent_cfg is not None else None,
            data_fingerprint=rec.get("data_fingerprint") or None,
            weight=rec.get("weight"),
            note=note,
            identity=identity,
        )
        stages.append(stage)
        if parent_cfg is not None or rec.get("lineage") is not None:
            grand = _records_of(rec, parent_config, parent_cfg)
            _attach(stages, stage, parent_cfg, grand, stage.data_fingerprint, [*seen, key])


def _same_order(
    rec: dict[str, Any], parent_cfg: TrainConfig | None, child_cfg: TrainConfig, child_fingerprint: str | None
) -> bool:
    """Whether the child's step k trained the batch the parent's step k did: the same data, seed, batch size."""
    theirs = rec.get("data_fingerprint")
    if theirs and child_fingerprint and theirs != child_fingerprint:
        return False
    if parent_cfg is None:
        return bool(theirs and child_fingerprint)  # nothing else to compare: only a matching fingerprint says so
    same = (parent_cfg.seed, parent_cfg.global_train_batch_size) == (child_cfg.seed, child_cfg.global_train_batch_size)
    return same and _batch_tokens(parent_cfg) == _batch_tokens(child_cfg)


def _records_of(rec: dict[str, Any], parent_config: str, parent_cfg: TrainConfig | None) -> list[dict[str, Any]]:
    """A parent's own parents: its record's `lineage` where written, else rebuilt from its config."""
    if rec.get("lineage") is not None:
        return [_checked(r, f"{rec['resolved']} (lineage record)", i) for i, r in enumerate(rec["lineage"])]
    return _own_records(parent_config, parent_cfg) if parent_cfg is not None else []


def _own_records(config_path: str, cfg: TrainConfig) -> list[dict[str, Any]]:
    """A run's parent records: the lineage of the checkpoint beside its config (a checkpoint's config.yaml) or of
    its save folder's latest checkpoint, where the trainer wrote one; else its `load_path`, read as a checkpoint."""
    beside = os.path.join(os.path.dirname(config_path), TRAINER_STATE)
    candidates = [beside] if not is_remote(config_path) and os.path.isfile(beside) else []
    latest = latest_checkpoint(cfg.save_folder)
    if latest is not None:
        candidates.append(os.path.join(latest, TRAINER_STATE))
    for path in candidates:
        state = _json(path)
        if "lineage" in state:
            value = state["lineage"]
            if not isinstance(value, list):
                raise DataError(f"{path}: lineage must be a list of parent records, got {shown(value)}")
            return [_checked(r, path, i) for i, r in enumerate(value)]
    load_path = cfg.load_path
    if not load_path:
        return []
    if not isinstance(load_path, str):
        raise DataError(f"{config_path}: load_path must be a checkpoint directory or URL, got {shown(load_path)}")
    if not is_remote(load_path) and os.path.abspath(load_path) == os.path.dirname(os.path.abspath(config_path)):
        return []  # an imported checkpoint's config names the checkpoint itself (import-hf, import-olmo)
    return [_record_from_checkpoint(load_path)]


def _record_from_checkpoint(given: str) -> dict[str, Any]:
    """The record the trainer would have written for a run started from `given` (for checkpoints older than
    lineage); an unreadable checkpoint gives a record whose `note` says why."""
    resolved = given.rstrip("/") if is_remote(given) else os.path.abspath(os.path.expanduser(given))
    rec: dict[str, Any] = {"source": "checkpoint", "given": given, "resolved": resolved, "weight": None}
    try:
        state = _json(join(resolved, TRAINER_STATE))
    except DataError as e:
        return rec | {"step": 0, "lineage": [], "unreadable": str(e)}
    except Exception as e:  # a remote store refusing or failing, in whatever way its client reports it
        if not is_remote(resolved):
            raise
        return rec | {"step": 0, "lineage": [], "unreadable": f"{resolved}: {type(e).__name__}: {e}"}
    rec |= {k: state.get(k) for k in ("run_name", "data_fingerprint", "tokens_seen")}
    rec["step"] = state.get("step", 0)
    if "lineage" in state:
        rec["lineage"] = state["lineage"]
    return _checked(rec, join(resolved, TRAINER_STATE), 0)


def _read_parent(rec: dict[str, Any]) -> tuple[TrainConfig | None, str, str | None]:
    """A parent checkpoint's config (None where it cannot be read), its path, and a note saying why not."""
    path = join(str(rec["resolved"]), CONFIG)
    if rec.get("unreadable"):
        return None, path, f"not reachable: {rec['unreadable']}; its steps are not traced"
    if rec["source"] not in TRAINED:
        return None, path, None
    try:
        return read_stage_config(path), path, None
    except DataError as e:
        return None, path, f"not reachable: {e}; its steps are not traced"
    except Exception as e:  # a remote store refusing or failing, in whatever way its client reports it
        if not is_remote(path):
            raise
        return None, path, f"not reachable: {path}: {type(e).__name__}: {e}; its steps are not traced"


def read_stage_config(path: str) -> TrainConfig:
    """A stage's config, local or at a URL (a checkpoint kept in an object store), read as the trainer reads it;
    its data may be gone or absent (an import's), which only leaves that stage untraced."""
    if not is_remote(path):
        return read_run_config(path, require_data=False)
    data = read_bytes(path)
    with tempfile.TemporaryDirectory() as tmp:
        local = os.path.join(tmp, CONFIG)
        with open(local, "wb") as f:
            f.write(data)
        try:
            return read_run_config(local, require_data=False)
        except DataError as e:
            raise DataError(str(e).replace(local, path)) from e


def _checked(rec: Any, where: str, i: int) -> dict[str, Any]:
    """A parent record, its keys checked by type: a bad one is an error naming the file and the key."""
    at = f"{where}: lineage[{i}]"
    if not isinstance(rec, dict):
        raise DataError(f"{at} must be a mapping (a parent record), got {shown(rec)}")
    if rec.get("source") not in SOURCES:
        raise DataError(f"{at}.source must be one of {', '.join(SOURCES)}, got {shown(rec.get('source'))}")
    if not isinstance(rec.get("resolved"), str) or not rec["resolved"]:
        raise DataError(f"{at}.resolved must be the parent checkpoint's path or URL, got {shown(rec.get('resolved'))}")
    for key in ("step", "tokens_seen"):
        value = rec.get(key, 0)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise DataError(f"{at}.{key} must be an integer of 0 or more, got {shown(value)}")
    rec.setdefault("step", 0)
    weight = rec.get("weight")
    if weight is not None and (isinstance(weight, bool) or not isinstance(weight, (int, float))):
        raise DataError(f"{at}.weight must be a number or null, got {shown(weight)}")
    if rec.get("counters") not in COUNTERS:
        raise DataError(f"{at}.counters must be continued, restarted or absent, got {shown(rec.get('counters'))}")
    if rec.get("lineage") is not None and not isinstance(rec["lineage"], list):
        raise DataError(f"{at}.lineage must be a list of parent records, got {shown(rec['lineage'])}")
    return rec


def _json(path: str) -> dict[str, Any]:
    try:
        obj = json.loads(read_bytes(path))
    except ValueError as e:
        raise DataError(f"{path}: not valid JSON ({e})") from e
    except RecursionError as e:  # a lineage nested thousands deep
        raise DataError(f"{path}: nested too deeply to read (a damaged or crafted lineage?)") from e
    except OSError as e:
        raise DataError(f"{path}: cannot be read ({e})") from e
    if not isinstance(obj, dict):
        raise DataError(f"{path}: expected a mapping of trainer state fields, got {shown(obj)}")
    return obj


def _batch_tokens(cfg: TrainConfig) -> int:
    return cfg.global_train_batch_size * cfg.model.max_sequence_length


def format_lineage(stages: list[Stage]) -> str:
    """One line per stage (indented under the stage that loaded it) with the tokens it trained, and the total."""
    lines = []
    for s in stages:
        lines.append("  " * s.depth + stage_line(s))
    total = sum(s.tokens_trained or 0 for s in stages)
    unknown = [s.index for s in stages if s.tokens_trained is None and s.source in ("run", *TRAINED)]
    lines.append(
        f"tokens trained in all stages: {total:,}"
        + (f" (stages {', '.join(map(str, unknown))} not counted: unknown)" if unknown else "")
    )
    return "\n".join(lines)


def stage_line(s: Stage) -> str:
    """`stage 1: run 'stage1' from checkpoint DIR (load_path 'X'), config C: steps 1..30 = 30 x 4,096 = ... tokens`."""
    head = f"stage {s.index}: run {s.run_name!r}"
    if s.parent_of is not None:
        kind = {"checkpoint": "", "soup": " (in a soup)"}.get(s.source, f" ({s.source})")
        also = "".join(f" and {i}" for i in s.also_loaded_by)
        head += f"{kind}, loaded by stage{'s' if also else ''} {s.parent_of}{also} from {s.checkpoint}"
        if s.given is not None and s.given != s.checkpoint:
            head += f" (given as {s.given!r})"
        if s.checkpoint_step is not None:
            head += f" at its step {s.checkpoint_step}"
        if s.weight is not None:
            head += f", weight {s.weight:g}"
    if s.config:
        head += f"; config {s.config}"
    if s.note:
        tokens = f"; {s.tokens_seen:,} tokens seen, as its checkpoint records" if s.tokens_seen is not None else ""
        return f"{head}: {s.note}{tokens}"
    if s.last_step is None:
        return f"{head}: steps {s.first_step}.. (no max_duration: length unknown)"
    if s.source.startswith("import"):
        return f"{head}: imported weights, no training steps here (the data that trained them is not known here)"
    if s.steps == 0:
        return f"{head}: no training steps of its own"
    tokens = f"{s.steps:,} x {s.batch_tokens:,} = {s.tokens_trained:,} tokens" if s.batch_tokens else ""
    planned = " planned (no checkpoint saved yet)" if s.planned else ""
    return f"{head}: steps {s.first_step}..{s.last_step}{planned} = {tokens}"
