"""The save folder's `latest` and `latest-unsharded` links: pointed at each new checkpoint, and put back when a copy
of the folder turned them into directories.

Object storage has no symbolic links: `gsutil cp -r`, `aws s3 sync` and `cp -rL` copy what a link points to, so a
run folder copied there and back holds `latest/` as a second full copy of the checkpoint it named. A link cannot
replace a directory (`os.replace` fails with IsADirectoryError), so without this every save of a resumed run
failed after its checkpoint was written, and `latest` stayed the stale copy. At start (and, should one appear
meanwhile, before each link is moved) such a directory is checked to be a copy of the checkpoint it names (same
step and kind, the same files of the same sizes, and the same contents: the checkpoint verified against the
copy's identical checksums.json, or compared byte for byte when it has none) and replaced by the link; a copy
whose checkpoint is gone is moved into place under the checkpoint's own name. Anything else there (another
checkpoint's files, an incomplete copy, a plain file) is refused in one line naming it, and left as it is.
"""

from __future__ import annotations

import contextlib
import filecmp
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from olmo_data.errors import DataError
from olmo_train.checkpoint import integrity
from olmo_train.checkpoint.layout import (
    CHECKSUMS,
    LATEST,
    LATEST_UNSHARDED,
    TMP_PREFIX,
    TRAINER_STATE,
    is_unsharded,
    list_checkpoints,
    step_dir,
)

log = logging.getLogger(__name__)


def point(link: Path, target: str) -> None:
    """Make `link` a relative link to `target` (a name in the same folder), atomically: a reader sees the old link
    or the new one, never none. A copied directory in the link's place is dealt with first (`restore_link`)."""
    if not link.is_symlink() and link.exists():
        restore_link(link)
    tmp = link.with_name(f"{TMP_PREFIX}{link.name}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    tmp.symlink_to(target)
    os.replace(tmp, link)


def restore_links(folder: Path) -> None:
    """At the start of a run: each `latest` link of the folder that a copy made a directory, put back."""
    for name in (LATEST, LATEST_UNSHARDED):
        link = folder / name
        if not link.is_symlink() and link.exists():
            restore_link(link)


def restore_link(link: Path) -> None:
    """Replace `link`, a directory that should have been the link to a checkpoint, by that link once it is shown
    to be a copy of the checkpoint it names; refuse it by name otherwise."""
    unsharded = link.name == LATEST_UNSHARDED
    refuse = _refusal(link)
    if not link.is_dir():
        raise refuse("a file, where the trainer keeps a link to the newest checkpoint")
    if not (link / TRAINER_STATE).is_file():
        raise refuse(f"a directory without {TRAINER_STATE}, so no copy of a complete checkpoint")
    state = integrity.read_trainer_state(link)  # a damaged one is named as damaged
    if is_unsharded(link) != unsharded:
        kind = "an unsharded" if is_unsharded(link) else "a sharded"
        raise refuse(f"a copy of {kind} checkpoint (step {state.step}), where the link to the other kind belongs")
    original = link.parent / step_dir(state.step, unsharded)
    if original.is_symlink() or not original.exists():
        log.warning("%s: a copy of %s (the link made a directory by a copy), moved into its place", link, original)
        original.unlink(missing_ok=True)
        os.replace(link, original)
    else:
        difference = _difference(link, original)
        if difference is not None:
            raise refuse(f"a directory that is not a copy of {original.name}, the checkpoint it names ({difference})")
        log.warning("%s: a copy of %s (the link made a directory by a copy); replaced by the link", link, original)
        shutil.rmtree(link)
    newest = [path for _, kind, path in list_checkpoints(link.parent) if kind == unsharded]
    point(link, newest[-1].name if newest else original.name)


def _refusal(link: Path) -> Callable[[str], DataError]:
    """A maker of the one-line refusal of `link`, saying what to do."""

    def refuse(why: str) -> DataError:
        return DataError(
            f"{link}: {why}; move it out of the save folder (or delete it) and start again: the trainer makes the "
            f"link anew to the newest complete step directory"
        )

    return refuse


def _files(directory: Path) -> dict[str, int]:
    """Every file under `directory`, by relative path, with its size (links followed, as a copy follows them)."""
    out = {}
    for root, _, names in os.walk(directory, followlinks=True):
        for name in names:
            path = Path(root) / name
            out[path.relative_to(directory).as_posix()] = path.stat().st_size
    return out


def _difference(copy: Path, original: Path) -> str | None:
    """Why `copy` is not a copy of the checkpoint `original`, or None when it is: the same files with the same
    sizes, and the same bytes (with checksums: the same checksums.json, and the checkpoint's files verified
    against it, reading the checkpoint once; without: every file compared)."""
    mine, theirs = _files(copy), _files(original)
    if set(mine) != set(theirs):
        only = sorted(set(mine) ^ set(theirs))[0]
        return f"{only} is in {'it' if only in mine else original.name} only"
    for name in sorted(mine):
        if mine[name] != theirs[name]:
            return f"{name} is {mine[name]} bytes in it, {theirs[name]} in {original.name}"
    if CHECKSUMS in mine:
        if (copy / CHECKSUMS).read_bytes() != (original / CHECKSUMS).read_bytes():
            return f"its {CHECKSUMS} differs"
        integrity.verify(original)  # the checkpoint kept is the one its records vouch for (a damaged file: named)
        return None
    for name in sorted(mine):
        if not filecmp.cmp(copy / name, original / name, shallow=False):
            return f"{name} differs"
    return None
