"""A run's length (`max_duration`: steps, tokens or epochs) and its conversion to steps, in one place: the config
loader checks the key with `parse_duration`, and every step count (the trainer's, `olmo_data.dataset.steps`) goes
through `duration_steps`, so the trainer and the data tools count the same steps."""

from __future__ import annotations

import math
import re

from olmo_data.errors import DataError, shown


def parse_duration(value: int | str) -> tuple[float, str]:
    """OLMo's max_duration: an int of steps, `...T` tokens or `...ep` epochs -> (amount, unit)."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value <= 0:
            raise DataError(f"duration {shown(value)}: must be positive")
        return float(value), "steps"
    text = str(value).strip()
    m = re.fullmatch(r"([0-9.eE+_]+)\s*(T|ep)?", text)
    if not m:
        raise DataError(f"duration {shown(value)}: expected steps (1000), tokens (2e9T) or epochs (3ep)")
    try:
        amount = float(m.group(1).replace("_", ""))
    except ValueError as e:
        raise DataError(f"duration {shown(value)}: expected steps (1000), tokens (2e9T) or epochs (3ep)") from e
    if not amount > 0:
        raise DataError(f"duration {shown(value)}: must be positive")
    if not math.isfinite(amount) or amount >= 2**63:  # 1e400 reads as infinity: no run of that many steps ends
        raise DataError(f"duration {shown(value)}: too large (at most 2**63)")
    return amount, {"T": "tokens", "ep": "epochs", None: "steps"}[m.group(2)]


def duration_steps(duration: int | str, *, global_batch_size: int, sequence_length: int, batches_per_epoch: int) -> int:
    """Training steps of an OLMo max_duration, as the trainer counts them: steps as given, tokens rounded up to
    whole steps, epochs as full batches (at least one step)."""
    amount, unit = parse_duration(duration)
    if unit == "tokens":
        return math.ceil(amount / (global_batch_size * sequence_length))
    if unit == "epochs":
        return max(1, round(amount * batches_per_epoch))
    return int(amount)
