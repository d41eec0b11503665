"""OLMo-core's variable-sequence-length settings and curricula: which batches an epoch of a NumpyVSLDataset has,
and in which order its loader draws them.

A `NumpyVSLDataset` sorts its instances into buckets by length (the powers of two from `min_sequence_length` to
`max_sequence_length`); a batch holds `global_batch_size // L` instances of one bucket L, so every batch is the
same number of tokens. Batches are numbered bucket after bucket, shortest first. The curriculum decides how many
batches each bucket gives an epoch and their order, from `PCG64(seed + epoch)`:

* natural: every whole batch of every bucket; a batch of the longest bucket first (drawn uniformly among them,
  swapped with batch 0), then the rest shuffled.
* grow_p2, grow_linear (`num_cycles` c, `balanced`): each bucket's batches cut to a multiple of c (with `balanced`,
  all to the smallest bucket's); the epoch is c cycles, each of as many sub-cycles as buckets. A cycle takes its
  share (`c` near-equal parts, larger first) of each bucket's batches, in order, and spreads them over the
  sub-cycles by odds that rotate with the bucket (powers of two, or linear); each sub-cycle is shuffled on its own.
  The first batch of the longest bucket is then swapped to the front.

`VSLSettings` reads the config.json keys that decide this (checked as OLMo-core checks them, and what it would
fail on refused by key); `batches_per_bucket` and `batch_order` rebuild OLMo-core's numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from olmo_data.errors import DataError, shown

CURRICULA = ("natural", "grow_p2", "grow_linear")  # OLMo-core 3.0.0's VSLCurriculumType
CLASS_NAMES = {
    "natural": "VSLNaturalCurriculum",
    "grow_p2": "VSLGrowP2Curriculum",
    "grow_linear": "VSLGrowLinearCurriculum",
}
MAX_LENGTH = 1 << 24  # the longest bucket read (config.MAX_SEQUENCE_LENGTH)
MAX_CYCLES = 1 << 20
DEFAULT_THREADS = 4  # OLMo-core's loader reads instances in 4 threads when num_threads is None and no workers


@dataclass(frozen=True)
class VSLCurriculum:
    """OLMo-core's curriculum of a VSL run (`num_cycles`, `balanced`: the growth curricula's)."""

    name: str = "natural"
    num_cycles: int | None = None
    balanced: bool | None = None

    @property
    def class_repr(self) -> str:
        """How OLMo-core's dataset fingerprint spells its curriculum (the curriculum dataclass's repr)."""
        if self.name == "natural":
            return "VSLNaturalCurriculum()"
        return f"{CLASS_NAMES[self.name]}(num_cycles={self.num_cycles!r}, balanced={self.balanced!r})"

    @property
    def short_str(self) -> str:
        """OLMo-core's folder name for the curriculum's order files (`short_str`)."""
        if self.name == "natural":
            return "vsl-natural"
        kind = "p2" if self.name == "grow_p2" else "linear"
        return f"vsl-grow-{kind}-{self.num_cycles}-cycle{'-balanced' if self.balanced else ''}"


@dataclass(frozen=True)
class VSLSettings:
    """A NumpyVSLDatasetConfig's keys, checked: its bucket lengths, curriculum, and how its loader reads."""

    min_length: int
    max_length: int
    curriculum: VSLCurriculum
    loader_threads: int  # threads OLMo-core's loader reads instances with in the training process (0: none)

    def run_fields(self) -> dict[str, Any]:
        """The OlmoCoreRun fields of a VSL run (its `sequence_length` is the longest bucket)."""
        return {
            "min_sequence_length": self.min_length,
            "curriculum": self.curriculum,
            "loader_threads": self.loader_threads,
        }


def _whole(section: dict[str, Any], key: str, what: str, where: str, lo: int, hi: int) -> int:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise DataError(f"{where}: {what}.{key} is {shown(value)}; expected a whole number from {lo:,} to {hi:,}")
    return value


def _power_of_two(value: int, key: str, where: str) -> None:
    if value & (value - 1):
        raise DataError(f"{where}: dataset.{key} is {value:,}; OLMo-core's VSL dataset needs a power of two")


def vsl_settings(dataset: dict[str, Any], loader: dict[str, Any], tokenizer: dict[str, Any], where: str) -> VSLSettings:
    """A NumpyVSLDatasetConfig's settings, refused where OLMo-core refuses them or would fail on them."""
    for key in ("label_mask_paths", "source_mixture_config", "sequence_length"):
        if dataset.get(key) is not None:
            raise DataError(f"{where}: dataset.{key} is not a key of OLMo-core's NumpyVSLDatasetConfig; remove it")
    if tokenizer.get("bos_token_id") is not None:
        raise DataError(f"{where}: dataset.tokenizer.bos_token_id is set; OLMo-core's VSL dataset refuses a BOS id")
    hi = _whole(dataset, "max_sequence_length", "dataset", where, 2, MAX_LENGTH)
    lo = _whole(dataset, "min_sequence_length", "dataset", where, 1, MAX_LENGTH)
    _power_of_two(hi, "max_sequence_length", where)
    _power_of_two(lo, "min_sequence_length", where)
    if lo >= hi:
        raise DataError(
            f"{where}: dataset.min_sequence_length {lo:,} is not below its max_sequence_length {hi:,}; OLMo-core's "
            "VSL dataset needs at least two buckets"
        )
    gbs = loader.get("global_batch_size")
    if isinstance(gbs, int) and not isinstance(gbs, bool) and gbs > 0 and gbs % hi:
        raise DataError(
            f"{where}: data_loader.global_batch_size ({gbs:,} tokens) is not a multiple of dataset."
            f"max_sequence_length ({hi:,}); OLMo-core's VSL loader cannot fill a batch of its longest bucket"
        )
    workers = loader.get("num_workers", 0)
    threads = loader.get("num_threads")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise DataError(f"{where}: data_loader.num_workers is {shown(workers)}; expected a whole number")
    if threads is not None:
        threads = _whole(loader, "num_threads", "data_loader", where, 0, 1 << 16)
    # worker processes keep their own count of batches drawn, and read without threads unless num_threads says
    in_process = 0 if workers > 0 else (DEFAULT_THREADS if threads is None else threads)
    return VSLSettings(lo, hi, _curriculum(dataset.get("vsl_curriculum"), where), in_process)


def _curriculum(section: Any, where: str) -> VSLCurriculum:
    """dataset.vsl_curriculum (OLMo-core's VSLCurriculumConfig; absent: natural)."""
    if section is None:
        return VSLCurriculum()
    what = "dataset.vsl_curriculum"
    if not isinstance(section, dict):
        raise DataError(f"{where}: {what} is {shown(section)}; expected OLMo-core's VSLCurriculumConfig")
    name = section.get("name", "natural")
    if name not in CURRICULA:
        raise DataError(f"{where}: {what}.name is {shown(name)}; expected one of {list(CURRICULA)}")
    if name == "natural":  # OLMo-core's validate() clears the growth keys
        return VSLCurriculum()
    if section.get("num_cycles") is None or section.get("balanced") is None:
        raise DataError(f"{where}: {what} ({name}) needs num_cycles and balanced; OLMo-core refuses it without them")
    balanced = section["balanced"]
    if not isinstance(balanced, bool):
        raise DataError(f"{where}: {what}.balanced is {shown(balanced)}; expected true or false")
    return VSLCurriculum(str(name), _whole(section, "num_cycles", what, where, 1, MAX_CYCLES), balanced)


def bucket_lengths(min_length: int, max_length: int) -> list[int]:
    """The bucket lengths, shortest first: every power of two from min to max."""
    return [1 << e for e in range(min_length.bit_length() - 1, max_length.bit_length())]


def batches_per_bucket(
    curriculum: VSLCurriculum, instances: list[tuple[int, int]], global_batch_size: int
) -> list[tuple[int, int]]:
    """(length, batches an epoch takes) per bucket, from (length, instances) per bucket."""
    natural = [(length, n // (global_batch_size // length)) for length, n in instances]
    if curriculum.name == "natural":
        return natural
    c = int(curriculum.num_cycles or 1)
    if curriculum.balanced:
        fewest = min(b for _, b in natural)
        return [(length, c * (fewest // c)) for length, _ in natural]
    return [(length, c * (b // c)) for length, b in natural]


def batch_order(curriculum: VSLCurriculum, per_bucket: list[tuple[int, int]], seed: int, where: str) -> np.ndarray:
    """OLMo-core's order of an epoch's batches (uint32 batch numbers, bucket after bucket), from `seed`
    (its loader's seed + the epoch). Refuses what OLMo-core fails on, naming it."""
    total = sum(b for _, b in per_bucket)
    if total == 0:
        raise DataError(f"{where}: no bucket has a whole batch; OLMo-core's VSL loader would train nothing")
    rng = np.random.Generator(np.random.PCG64(seed))
    if curriculum.name == "natural":
        last = per_bucket[-1][1]
        if last == 0:
            raise DataError(
                f"{where}: the longest bucket ({per_bucket[-1][0]:,} tokens) has no whole batch; OLMo-core's natural "
                "curriculum fails drawing its first batch from it"
            )
        order = np.arange(total, dtype=np.uint32)
        first = int(rng.integers(total - last, total))
        order[0], order[first] = order[first], order[0]
        rng.shuffle(order[1:])
        return order
    return _growth_order(curriculum, per_bucket, rng, where)


def near_equal_parts(n: int, parts: int) -> list[int]:
    """`n` split into `parts` counts, each the ceiling of what is left over the parts left (larger first)."""
    out: list[int] = []
    while len(out) < parts:
        c = -(-n // (parts - len(out)))
        out.append(c)
        n -= c
    return out


def bucket_odds(name: str, bucket: int, buckets: int) -> list[int]:
    """The odds of bucket `bucket` in each sub-cycle: its exponent climbs from `buckets - bucket` to `buckets`,
    then falls back; grow_p2 takes 2 ** (exponent - 1), grow_linear the exponent."""
    first = buckets - bucket
    out = []
    for sub in range(buckets):
        e = first + sub if first + sub <= buckets else first - (first + sub) % buckets
        out.append(2 ** (e - 1) if name == "grow_p2" else e)
    return out


def subcycle_counts(name: str, bucket: int, buckets: int, batches: int) -> list[int]:
    """How a cycle's `batches` of a bucket spread over its sub-cycles: each odds' share rounded (Python's round,
    half to even), the shortfall added to the last."""
    odds = bucket_odds(name, bucket, buckets)
    total_odds = sum(odds)
    out = [round(o / total_odds * batches) for o in odds]
    if sum(out) < batches:
        out[-1] += batches - sum(out)
    return out


def _growth_order(
    curriculum: VSLCurriculum, per_bucket: list[tuple[int, int]], rng: np.random.Generator, where: str
) -> np.ndarray:
    cycles = int(curriculum.num_cycles or 1)
    buckets = len(per_bucket)
    starts = np.cumsum([0] + [b for _, b in per_bucket]).tolist()
    out: list[np.ndarray] = []
    for cycle in range(cycles):
        pieces: list[list[np.ndarray]] = []  # per bucket, its batches of each sub-cycle
        for k, (length, n) in enumerate(per_bucket):
            shares = near_equal_parts(n, cycles)
            mine = np.arange(sum(shares[:cycle]), sum(shares[: cycle + 1]), dtype=np.uint32) + starts[k]
            counts = subcycle_counts(curriculum.name, k, buckets, shares[cycle])
            if sum(counts) != len(mine):
                raise DataError(
                    f"{where}: the {curriculum.name} curriculum rounds bucket {length:,}'s {len(mine)} batches of "
                    f"cycle {cycle} to {sum(counts)} over its sub-cycles; OLMo-core's curriculum fails on that "
                    "(choose another num_cycles or global_batch_size)"
                )
            cuts = np.cumsum(counts)[:-1]
            pieces.append(np.split(mine, cuts))
        for sub in range(buckets):
            together = np.concatenate([pieces[k][sub] for k in range(buckets)])
            rng.shuffle(together)
            out.append(together)
    order = np.concatenate(out)
    first_long = int(np.argmax(order >= starts[-2]))
    order[0], order[first_long] = order[first_long], order[0]
    return order
