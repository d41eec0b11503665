"""Format-neutral conversion tables: every tensor name and config field of a foreign format against ours.

A table lists (our name, their name) patterns, `{i}` standing for the layer, plus the tensors the other format
fuses (OLMo's own `att_proj` is q|k|v). Export and import both read the same table (`to_their_state`,
`to_our_state`), so a name can never be mapped one way and forgotten the other, and both check that the state is
exactly the tensors the model config implies. Each format is one module holding its tables: `hf.py` (Hugging Face
`transformers`), `olmo_native.py` (OLMo's own checkpoints).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from olmo_data.config import ModelConfig
from olmo_data.errors import DataError
from olmo_train.nn import Transformer


@dataclass(frozen=True)
class Fused:
    """One of their tensors that is several of ours stacked by rows (dim 0), in this order. The rows of each part
    come from our model's shapes, so one entry serves every size and GQA setting."""

    theirs: str
    ours: tuple[str, ...]


@dataclass(frozen=True)
class TensorTable:
    """Every tensor name of one format against ours. An entry that matches nothing in a given model (a norm
    without weights, the output head of a tied model) is simply unused, so one table serves every variant."""

    renames: tuple[tuple[str, str], ...]  # (our name, their name)
    fused: tuple[Fused, ...] = ()
    ignored: tuple[str, ...] = ()  # their tensors that are derived buffers, skipped when reading

    def pairs(self) -> tuple[tuple[str, str], ...]:
        """(our name, their name) for each of our tensors; a fused part is named by the tensor it is part of."""
        return self.renames + tuple((ours, f.theirs) for f in self.fused for ours in f.ours)


@dataclass(frozen=True)
class ConfigField:
    """A transformers config key and the ModelConfig field it is. `export` computes it where ours is implicit
    (None meaning "the default"); `read` finds it where transformers versions spell it differently."""

    theirs: str
    ours: str
    kind: type
    export: Callable[[ModelConfig], Any] | None = None
    read: Callable[[dict[str, Any]], Any] | None = None


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(re.escape(pattern).replace(r"\{i\}", r"(?P<i>\d+)"))


def renamer(pairs: tuple[tuple[str, str], ...]) -> Callable[[str], str | None]:
    """From-name -> to-name (None for a name the table does not know), for one direction of a table."""
    compiled = [(_compile(src), dst) for src, dst in pairs]

    def rename(key: str) -> str | None:
        for pattern, dst in compiled:
            m = pattern.fullmatch(key)
            if m:
                return dst.format(i=m.group("i")) if "i" in pattern.groupindex else dst
        return None

    return rename


def expected_shapes(model: ModelConfig) -> dict[str, torch.Size]:
    """Our parameter names and shapes for `model`, from the model itself (built without memory)."""
    with torch.device("meta"):
        return {k: v.shape for k, v in Transformer(model).state_dict().items()}


def _check_state(
    state: dict[str, torch.Tensor], model: ModelConfig, name: Callable[[str], str], source: str
) -> list[str]:
    """Refuse a state that is not exactly the tensors `model` has, naming them as `name` does; return our
    names in the model's own order."""
    expected = expected_shapes(model)
    missing = list(dict.fromkeys(name(k) for k in expected if k not in state))  # a fused tensor is named once
    if missing:
        raise DataError(f"{source}: missing {len(missing)} tensors the config implies, e.g. {missing[:4]}")
    unexpected = sorted(name(k) for k in state if k not in expected)
    if unexpected:  # e.g. layers past num_hidden_layers
        raise DataError(f"{source}: tensors the config does not account for, e.g. {unexpected[:4]}")
    for key, shape in expected.items():
        if state[key].shape != shape:
            raise DataError(
                f"{source}: {name(key)} has shape {list(state[key].shape)}, the config implies {list(shape)}"
            )
    return list(expected)


def _fused_parts(table: TensorTable) -> Callable[[str], tuple[str, ...] | None]:
    """Their name -> our names of its parts, in order (None for a tensor that is not fused)."""
    compiled = [(_compile(f.theirs), f.ours) for f in table.fused]

    def parts(key: str) -> tuple[str, ...] | None:
        for pattern, ours in compiled:
            m = pattern.fullmatch(key)
            if m:
                return tuple(p.format(i=m.group("i")) if "i" in pattern.groupindex else p for p in ours)
        return None

    return parts


def to_their_state(
    table: TensorTable, state: dict[str, torch.Tensor], model: ModelConfig, fmt: str, source: str
) -> dict[str, torch.Tensor]:
    """Our state dict under the table's names, fused tensors concatenated. A tied output head is left out:
    transformers and OLMo both use the embedding for it (and safetensors cannot hold one tensor twice)."""
    their_name = renamer(table.pairs())
    parts = _fused_parts(table)
    unknown = [k for k in state if their_name(k) is None]
    if unknown:
        raise DataError(f"{source}: tensors that a {fmt} model has no place for: {unknown[:4]}")
    out: dict[str, torch.Tensor] = {}
    for key in _check_state(state, model, str, source):
        name = their_name(key) or key
        if (model.weight_tying and key == "lm_head.weight") or name in out:  # a fused one is made at its first part
            continue
        fused = parts(name)
        out[name] = torch.cat([state[p] for p in fused]) if fused else state[key]
    return out


def to_our_state(
    table: TensorTable, theirs: dict[str, torch.Tensor], model: ModelConfig, fmt: str, source: str
) -> dict[str, torch.Tensor]:
    """Their tensors under our names for `model`, fused ones split by the rows our parts have (each part a copy
    of its own, so that saving one does not save the whole fused tensor). A tied head (absent, or present and
    unused) is the embedding tensor itself, under both our names, as `state_dict()` has it. `theirs` is emptied as
    it is read, so that memory stays near one model."""
    our_name = renamer(tuple((t, o) for o, t in table.renames))
    their_name = renamer(table.pairs())
    parts = _fused_parts(table)
    ignored = [_compile(p) for p in table.ignored]
    shapes = expected_shapes(model)
    state: dict[str, torch.Tensor] = {}
    for key in list(theirs):
        tensor = theirs.pop(key)
        fused = parts(key)
        if fused is not None:
            state.update(_split(key, tensor, fused, shapes, source))
            continue
        ours = our_name(key)
        if ours is None:
            if any(p.fullmatch(key) for p in ignored):
                continue
            raise DataError(f"{source}: tensor {key} has no place in our {fmt} model (an unsupported variant?)")
        state[ours] = tensor
    if model.weight_tying and "embeddings.weight" in state:
        state["lm_head.weight"] = state["embeddings.weight"]
    keys = _check_state(state, model, lambda k: their_name(k) or k, source)
    return {k: state[k] for k in keys}


def _split(
    key: str, tensor: torch.Tensor, parts: tuple[str, ...], shapes: dict[str, torch.Size], source: str
) -> dict[str, torch.Tensor]:
    if any(p not in shapes for p in parts):  # e.g. a layer past n_layers
        raise DataError(f"{source}: tensors the config does not account for, e.g. {[key]}")
    rows = [shapes[p][0] for p in parts]
    want = [sum(rows), *shapes[parts[0]][1:]]
    if list(tensor.shape) != want:
        raise DataError(
            f"{source}: {key} has shape {list(tensor.shape)}, the config implies {want} "
            f"({' + '.join(map(str, rows))} rows for {', '.join(parts)})"
        )
    return {p: t.clone() for p, t in zip(parts, tensor.split(rows), strict=True)}
