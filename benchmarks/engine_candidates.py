"""Candidate BPE engines not yet behind `--backend`, against riptoken (what GPT-2 and GPT-NeoX-20B run on now).

Issue 44 asks for the fastest exact engine per tokenizer. quicktok already runs cl100k; for GPT-2's split regex
(GPT-2, GPT-NeoX-20B) riptoken is the fastest engine in use. This script measures the others on PyPI side by side,
in one process, one thread each (RAYON_NUM_THREADS / FASTOKENS_BPE_THREADS = 1, set before any engine loads), on
about 15 MB of the standard library's Python sources:

  riptoken    `CoreBPE.encode_ordinary` on our plan (`tiktoken_plan`: for GPT-NeoX-20B the text NFC-normalised and
              with its space pairs), the raw rate `tokenize_throughput.py` reports
  fastokens   `Tokenizer.from_file(tokenizer.json).encode(text)`: its own pipeline (added tokens, NFC), which is
              how it would have to run GPT-NeoX-20B: `from_tiktoken` turns ranks into merges and refuses the space
              pairs' whole-piece ranks ("did not decompose into 2 pieces")
  tokie       `Tokenizer.from_json(path).encode(text)`
  kitoken     `Kitoken.from_tokenizers_file(path).encode(text, True)`

Each engine encodes fresh `str` objects (no UTF-8 conversion cached from an earlier pass), once, timed in CPU
seconds, after a warm-up on its last 20 documents; `same` counts the documents whose ids equal HF `tokenizers`'
(no special tokens added). An engine that is not installed is reported as such. The engines are not project
dependencies; in a scratch venv:

    python3 -m venv /tmp/engvenv && /tmp/engvenv/bin/pip install fastokens tokie kitoken riptoken tokenizers \\
        numpy msgspec
    PYTHONPATH=. /tmp/engvenv/bin/python benchmarks/engine_candidates.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "tokenizers"


def corpus(megabytes: float) -> list[str]:
    """The standard library's Python sources, in path order, up to `megabytes` of UTF-8."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        texts.append(text)
        total += len(text.encode())
        if total >= megabytes * 1e6:
            break
    return texts


def engines(path: str) -> dict[str, Callable[[str], list[int]] | str]:
    """Each candidate's encode-one-text function, or why it cannot run here."""
    from olmo_data.tokenizer.tiktoken_plan import PAIR, pair_space_runs, plan_from_json

    found: dict[str, Callable[[str], list[int]] | str] = {}
    with open(path, encoding="utf-8") as f:
        plan = pair_space_runs(plan_from_json(json.load(f)))
    try:
        import riptoken

        core = riptoken.CoreBPE(plan.ranks, {}, plan.pat_str)
        if plan.space_pairs:  # (`pair_space_runs` pairs GPT-NeoX-20B's, whose tokenizer.json also asks for NFC)
            found["riptoken"] = lambda t: core.encode_ordinary(unicodedata.normalize("NFC", t).replace("  ", PAIR))
        else:
            found["riptoken"] = core.encode_ordinary
    except ImportError:
        found["riptoken"] = "not installed"
    try:
        import fastokens

        ft = fastokens.Tokenizer.from_file(path)
        found["fastokens"] = lambda t: ft.encode(t).ids
    except ImportError:
        found["fastokens"] = "not installed"
    try:
        import tokie

        tk = tokie.Tokenizer.from_json(path)
        found["tokie"] = lambda t: tk.encode(t, add_special_tokens=False).ids
    except ImportError:
        found["tokie"] = "not installed"
    try:
        import kitoken

        kt = kitoken.Kitoken.from_tokenizers_file(path)
        found["kitoken"] = lambda t: kt.encode(t, True)
    except ImportError:
        found["kitoken"] = "not installed"
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", action="append", help="tokenizer.json (repeatable; default GPT-2, NeoX)")
    parser.add_argument("--mb", type=float, default=15.0, help="megabytes of text (default 15)")
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    sys.path.insert(0, str(ROOT))
    import tokenizers

    texts = corpus(args.mb)
    print(f"{len(texts)} documents, {sum(len(t.encode()) for t in texts) / 1e6:.1f} MB")
    for path in args.tokenizer or [str(SHARED / "gpt2.json"), str(SHARED / "gpt-neox-20b.json")]:
        hf = tokenizers.Tokenizer.from_file(path)
        ref = [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)]
        n = sum(map(len, ref))
        base: float | None = None
        for name, encode in engines(path).items():
            if isinstance(encode, str):
                print(f"{Path(path).name:18} {name:10} {encode}")
                continue
            for t in texts[-20:]:  # a warm-up (first-touch memory), on texts timed last, so it caches little
                encode((t + " ")[:-1])
            fresh = [(t + " ")[:-1] for t in texts]  # new str objects: no UTF-8 form cached by an earlier pass
            start = time.process_time()
            out = [encode(t) for t in fresh]
            cpu = time.process_time() - start
            same = sum(list(a) == b for a, b in zip(out, ref, strict=True))
            if name == "riptoken":
                base = cpu
            ratio = f"{base / cpu:5.2f}x riptoken" if base else "(no riptoken)"
            print(
                f"{Path(path).name:18} {name:10} cpu {cpu:6.3f} s  {n / cpu / 1e6:6.2f} M tok/s  {ratio}  "
                f"same {same}/{len(ref)}"
            )


if __name__ == "__main__":
    main()
