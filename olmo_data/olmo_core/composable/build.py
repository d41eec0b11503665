"""The sources of a composable run built from its config nodes, as each OLMo-core config class's `build` does.

A token or document source config builds a *list* of sources (a `NumpyDocumentSourceConfig` one per group of
`source_group_size` files), an instance source config one source; the loader gets one per entry of the dataset
list. Each kind's rules live in its own module; this one only dispatches by class name.
"""

from __future__ import annotations

from dataclasses import dataclass

from olmo_data.errors import DataError
from olmo_data.olmo_core.composable.instances import ConcatAndChunk, ConcatenatedInstances, InstanceSource
from olmo_data.olmo_core.composable.mixing import MixingInstances, MixingTokens
from olmo_data.olmo_core.composable.packing import Packing
from olmo_data.olmo_core.composable.random_source import RandomInstances
from olmo_data.olmo_core.composable.sampling import SamplingDocs, SamplingInstances, SamplingTokens
from olmo_data.olmo_core.composable.sliced import split_instances, split_tokens
from olmo_data.olmo_core.composable.spec import Node, dtype_of, numpy_paths
from olmo_data.olmo_core.composable.tokens import Concatenated, TokenSource, open_numpy, source_run
from olmo_data.olmo_core.config import OlmoCoreRun


@dataclass
class Context:
    """What every build needs: the run (its ids, work_dir) and the config file, for messages."""

    run: OlmoCoreRun
    where: str


def build_tokens(node: Node, ctx: Context) -> list[TokenSource]:
    """The token (or document) sources of a token source config."""
    cls = node.cls
    if cls == "NumpyDocumentSourceConfig":
        return build_numpy(node, ctx)
    if cls in ("ConcatenatedTokenSourceConfig", "ConcatenatedDocumentSourceConfig"):
        sources = [s for child in node["sources"] for s in build_tokens(child, ctx)]
        return [Concatenated(sources, document=cls == "ConcatenatedDocumentSourceConfig", label=node["label"])]
    if cls == "SplitTokenSourceConfig":
        return [split_tokens(build_tokens(node["source"], ctx), node["ratio"], node["idx"])]
    if cls in ("SamplingTokenSourceConfig", "SamplingDocumentSourceConfig"):
        sources = [s for child in node["sources"] for s in build_tokens(child, ctx)]
        budget = node["max_tokens"]
        if budget is None:
            budget = int(node["factor"] * sum(s.num_tokens for s in sources))
        kind = SamplingDocs if cls == "SamplingDocumentSourceConfig" else SamplingTokens
        return [kind(sources, budget, node["seed"], node["label"])]
    if cls in ("MixingTokenSourceConfig", "MixingDocumentSourceConfig"):
        document = cls == "MixingDocumentSourceConfig"
        specs = []
        for spec in node["source_specs"]:
            built = build_tokens(spec["source"], ctx)
            source = built[0] if len(built) == 1 else Concatenated(built, document=document)
            specs.append((source, spec["ratio"], spec["max_repetition_factor"]))
        mix = MixingTokens(
            specs,
            document=document,
            seed=node["seed"],
            num_tokens=node["num_tokens"],
            label=node["label"],
            what=at(node, ctx),
        )
        return [mix]
    raise DataError(f"{ctx.where}: {node.at} is OLMo-core's {cls}; not covered")


def build_numpy(node: Node, ctx: Context) -> list[TokenSource]:
    """`NumpyDocumentSourceConfig.build`: one source over all its files, split into groups of source_group_size
    (the groups find documents without max_document_length: see `NumpyDocs.split`)."""
    paths, masks = numpy_paths(node, ctx.where)
    tokenizer = node["tokenizer"]
    label = node["label"]
    if label is None:
        label = node["source_paths"][0] if len(node["source_paths"]) == 1 else "various paths"
    run = source_run(ctx.run, dtype_of(node), tokenizer.eos_token_id, tokenizer.bos_token_id)
    main = open_numpy(
        paths,
        masks,
        run,
        f"{ctx.where}: {node.at}",
        max_document_length=node["max_document_length"],
        long_doc_strategy=node["long_doc_strategy"],
        label=label,
    )
    group = node["source_group_size"]
    return list(main.split(group)) if group > 0 else [main]


def build_instances(node: Node, ctx: Context) -> InstanceSource:
    """The instance source of an instance source config."""
    cls = node.cls
    if cls == "ConcatAndChunkInstanceSourceConfig":
        L = node["sequence_length"]
        sources = [s for child in node["sources"] for s in build_tokens(child, ctx)]
        return ConcatAndChunk(sources, L, node["max_sequence_length"] or L, node["label"])
    if cls == "ConcatenatedInstanceSourceConfig":
        return ConcatenatedInstances([build_instances(child, ctx) for child in node["sources"]])
    if cls == "PackingInstanceSourceConfig":
        return Packing(
            [s for child in node["sources"] for s in build_tokens(child, ctx)],
            node["sequence_length"],
            node["tokenizer"].pad_token_id,
            long_doc_strategy=node["long_doc_strategy"],
            source_group_size=node["source_group_size"],
            label=node["label"],
        )
    if cls == "RandomInstanceSourceConfig":
        L = node["sequence_length"]
        return RandomInstances(
            node["tokenizer"],
            L,
            node["max_sequence_length"] or L,
            node["avg_document_length"],
            node["seed"],
            num_tokens=node["num_tokens"],
            num_instances=node["num_instances"],
            label=node["label"],
        )
    if cls == "SplitInstanceSourceConfig":
        return split_instances(build_instances(node["source"], ctx), node["ratio"], node["idx"], node["seed"])
    if cls == "SamplingInstanceSourceConfig":
        children = [build_instances(child, ctx) for child in node["sources"]]
        max_tokens, max_instances = node["max_tokens"], node["max_instances"]
        if max_tokens is None and max_instances is None:
            max_tokens = int(node["factor"] * sum(s.num_tokens for s in children))
        return SamplingInstances(
            children, max_tokens=max_tokens, max_instances=max_instances, seed=node["seed"], label=node["label"]
        )
    if cls == "MixingInstanceSourceConfig":
        specs = [
            (build_instances(spec["source"], ctx), spec["ratio"], spec["max_repetition_factor"])
            for spec in node["source_specs"]
        ]
        return MixingInstances(
            specs,
            seed=node["seed"],
            num_tokens=node["num_tokens"],
            num_instances=node["num_instances"],
            label=node["label"],
            what=at(node, ctx),
        )
    raise DataError(f"{ctx.where}: {node.at} is OLMo-core's {cls}; not covered")


def at(node: Node, ctx: Context) -> str:
    """Where a node is, as messages name it."""
    return f"{ctx.where}: {node.at}"
