"""Text generation from a trained (or imported) model: a key/value cache, samplers and beam search.

`olmo_train.convert.load_model(checkpoint)` gives the model and the tokenizer its data was made with, in eval mode,
from any checkpoint this project reads (sharded, unsharded, imported, a `transformers` directory, or a URL).
`generate(model, prompts, max_steps)` returns `GenerationOutput(token_ids (batch, beam, steps), scores (batch,
beam))`, best beam first, as OLMo's beam search does; `beam_size=1` is greedy decoding or, with a sampler,
sampling.

What this gets right that is easy to get wrong: prompts of different lengths are padded on the left and every row
keeps its own positions (the first real token is position 0) and never attends to padding, so a row gives the same
tokens in a batch as alone; sampling draws from one seeded generator from the first token on, so a seed
reproduces a sample; beams that end keep their score while the others go on; the cache is allocated once for the
whole prompt plus continuation, which may be longer than the length the model was trained with, except that a layer
with an attention window (OLMo 3's sliding layers) keeps only the window's last tokens.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from olmo_data.errors import DataError
from olmo_data.trace import SpansReport, trace_spans
from olmo_train.checkpoint import config_path
from olmo_train.convert import load_model
from olmo_train.distributed import device_named
from olmo_train.nn import Transformer

log = logging.getLogger(__name__)


class KVCache:
    """Every layer's keys and values, preallocated: a decode step writes one column per layer instead of
    concatenating (and copying) the whole history. A full-attention layer holds `max_len` tokens; a layer with a
    window of w tokens only the w - 1 before the current ones, which are all a new token can see, in a buffer of
    w - 1 + SLACK columns that is compacted (its last w - 1 moved to the front) once every SLACK tokens."""

    SLACK = 256

    def __init__(self, model: Transformer, batch: int, max_len: int, dtype: torch.dtype, device: torch.device):
        cfg = model.cfg
        heads, head_dim = cfg.n_kv_heads or cfg.n_heads, cfg.d_model // cfg.n_heads
        self.length = 0  # tokens seen, the same for every layer once a forward pass is complete
        self.layers = [
            _Layer(
                self,
                i,
                (batch, heads, max_len if w is None else min(max_len, w - 1 + self.SLACK), head_dim),
                None if w is None else w - 1,
                dtype,
                device,
            )
            for i, w in enumerate(model.windows)
        ]

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep (and duplicate) the rows a beam search step selected: row j becomes old row rows[j]. Only the
        filled part is copied, except when the number of rows changes (the prompt's row becoming its beams)."""
        for layer in self.layers:
            layer.reorder(rows)


class _Layer:
    """One layer's keys and values: columns start..end of its buffers, in the order of the tokens."""

    def __init__(
        self,
        cache: KVCache,
        index: int,
        shape: tuple[int, int, int, int],
        keep: int | None,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.cache, self.index, self.keep = cache, index, keep  # keep: the tokens a windowed layer keeps (w - 1)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.start = self.end = 0

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this call's keys/values; return the earlier ones this layer keeps followed by these."""
        new = k.shape[2]
        if self.end + new <= self.k.shape[2]:
            self.k[:, :, self.end : self.end + new] = k
            self.v[:, :, self.end : self.end + new] = v
            self.end += new
            keys, values = self.k[:, :, self.start : self.end], self.v[:, :, self.start : self.end]
        else:  # a windowed layer's buffer is full: keep its last w - 1 tokens at the front
            keys = torch.cat([self.k[:, :, self.start : self.end], k], dim=2)
            values = torch.cat([self.v[:, :, self.start : self.end], v], dim=2)
            kept = min(keys.shape[2], self.keep or 0)
            self.k[:, :, :kept] = keys[:, :, keys.shape[2] - kept :]
            self.v[:, :, :kept] = values[:, :, values.shape[2] - kept :]
            self.start, self.end = 0, kept
        if self.keep is not None:
            self.start = max(self.start, self.end - self.keep)
        if self.index == len(self.cache.layers) - 1:
            self.cache.length += new
        return keys, values

    def reorder(self, rows: torch.Tensor) -> None:
        if rows.numel() != self.k.shape[0]:
            self.k, self.v = self.k.index_select(0, rows), self.v.index_select(0, rows)
            return
        a, b = self.start, self.end
        self.k[:, :, a:b] = self.k[rows, :, a:b]
        self.v[:, :, a:b] = self.v[rows, :, a:b]


class Sampler(Protocol):
    """Chooses `k` distinct next tokens per row from log-probabilities (N, V): returns their ids (N, k) and their
    log-probabilities (N, k)."""

    def __call__(
        self, logprobs: torch.Tensor, k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def greedy(
    logprobs: torch.Tensor, k: int, generator: torch.Generator | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens (k=1: greedy decoding; beam search's usual expansion)."""
    values, ids = logprobs.topk(k, dim=-1)
    return ids, values


@dataclass
class Sampling:
    """Random tokens from the model's distribution, reshaped by temperature, then cut to the `top_k` most likely
    and to the smallest set whose probability reaches `top_p`. The returned log-probabilities are the model's
    own (before reshaping), so beam scores stay sequence log-likelihoods."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise DataError(f"temperature must be > 0 (got {self.temperature}); use greedy decoding for 0")
        if self.top_k is not None and self.top_k < 1:
            raise DataError(f"top_k must be at least 1 (got {self.top_k})")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise DataError(f"top_p must be in (0, 1] (got {self.top_p})")

    def __call__(
        self, logprobs: torch.Tensor, k: int, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        scaled = logprobs / self.temperature
        if self.top_k is not None and self.top_k < scaled.shape[-1]:
            kth = scaled.topk(self.top_k, dim=-1).values[:, -1:]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if self.top_p is not None and self.top_p < 1:
            sorted_lp, order = scaled.sort(dim=-1, descending=True)
            probs = sorted_lp.softmax(dim=-1)
            before = probs.cumsum(dim=-1) - probs  # probability of the more likely tokens
            drop = (before >= self.top_p).scatter(-1, order, before >= self.top_p)
            scaled = scaled.masked_fill(drop, float("-inf"))
        # k draws without replacement, in proportion to the reshaped probabilities: the k largest of
        # log-probability + Gumbel noise (unlike torch.multinomial, this never fails when fewer than k tokens
        # survive the cuts; those beyond get -inf and lose to any real candidate)
        uniform = torch.rand(scaled.shape, generator=generator, device=scaled.device).clamp_(min=1e-20)
        ids = (scaled.log_softmax(-1) - (-uniform.log()).log()).topk(k, dim=-1).indices
        cut = scaled.gather(-1, ids) == float("-inf")
        return ids, logprobs.gather(-1, ids).masked_fill(cut, float("-inf"))


@dataclass
class GenerationOutput:
    token_ids: torch.Tensor  # (batch, beam, steps) int64; after a stop id, the stop id repeats
    scores: torch.Tensor  # (batch, beam) sum of the tokens' log-probabilities, best beam first


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths as one (B, T) batch padded on the left, and its (B, T) bool mask of real
    tokens."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise DataError("generate: every prompt needs at least one token")
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    real = torch.zeros((len(prompts), width), dtype=torch.bool)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.as_tensor(list(p), dtype=torch.long)
        real[row, width - len(p) :] = True
    return ids, real


@torch.inference_mode()
def generate(
    model: Transformer,
    input_ids: torch.Tensor | Sequence[Sequence[int]],
    max_steps: int,
    *,
    attention_mask: torch.Tensor | None = None,
    beam_size: int = 1,
    per_node_beam_size: int | None = None,
    min_steps: int = 0,
    sampler: Sampler | None = None,
    stop_ids: Sequence[int] = (),
    seed: int | None = None,
) -> GenerationOutput:
    """Continue each prompt by up to `max_steps` tokens.

    `input_ids` is a list of token lists, or a (B, T) tensor left-padded with `attention_mask` (B, T) marking
    real tokens. Each step, every beam proposes `per_node_beam_size` (default `beam_size`) next tokens chosen
    by `sampler` (default: the most likely ones) and the `beam_size` best-scoring continuations are kept. A
    beam that emits one of `stop_ids` is finished; it keeps its score and is carried on with the stop id.
    Generation ends when every beam is finished or after `max_steps`. No stop id is allowed before
    `min_steps` tokens.
    """
    if max_steps < 1:
        raise DataError(f"generate: max_steps must be at least 1 (got {max_steps})")
    if beam_size < 1:
        raise DataError(f"generate: beam_size must be at least 1 (got {beam_size})")
    per_node = per_node_beam_size or beam_size
    if stop_ids == () and min_steps:
        log.warning("min_steps=%d has no effect without stop_ids", min_steps)
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids.long()
        real = attention_mask.bool() if attention_mask is not None else torch.ones_like(ids, dtype=torch.bool)
    else:
        ids, real = left_pad(input_ids)
    sampler = sampler or greedy
    device = next(model.parameters()).device
    ids, real = ids.to(device), real.to(device)
    B, T = ids.shape
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    stops = torch.as_tensor(list(stop_ids), dtype=torch.long, device=device)

    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    cache = KVCache(model, B, T + max_steps, next(model.parameters()).dtype, device)
    padded = not bool(real.all())
    mask = None  # no padding: plain causal attention, the fast path
    if padded:  # a query sees earlier real tokens; a padding query sees itself only (a row with no key at all
        # would give NaN, which would leak into the real rows through the cache)
        causal = torch.ones(T, T, dtype=torch.bool, device=device).tril()
        mask = (causal & (real[:, None, :] | torch.eye(T, dtype=torch.bool, device=device))).unsqueeze(1)
    logits = model(ids, positions=positions if padded else None, mask=mask, cache=cache.layers, last_only=True)

    keys = real  # (rows, S): which cached positions are real tokens
    next_pos = positions[:, -1] + 1
    scores = torch.zeros(B, 1, device=device)  # (batch, beams)
    history = torch.empty(B, 1, 0, dtype=torch.long, device=device)
    finished = torch.zeros(B, 1, dtype=torch.bool, device=device)
    for step in range(max_steps):
        beams = scores.shape[1]
        logprobs = logits[:, -1].float().log_softmax(-1)  # (B * beams, V)
        if step < min_steps and stops.numel():
            logprobs[:, stops] = float("-inf")
        k = beam_size if step == 0 else per_node  # at first every beam is the prompt: draw beam_size from it
        cand_ids, cand_lp = sampler(logprobs, k, generator)
        done = finished.reshape(-1)
        if stops.numel() and bool(done.any()):  # a finished beam continues with the stop id at no cost
            cand_ids[done] = stops[0]
            cand_lp[done] = float("-inf")
            cand_lp[done, 0] = 0.0
        total = (scores.reshape(-1, 1) + cand_lp).reshape(B, beams * k)
        width = min(beam_size, beams * k)
        scores, flat = total.topk(width, dim=-1)  # sorted: best first
        origin = flat // k  # which beam each survivor extends
        token = cand_ids.reshape(B, beams * k).gather(1, flat)
        rows = (torch.arange(B, device=device)[:, None] * beams + origin).reshape(-1)
        history = torch.cat(
            [history.gather(1, origin[..., None].expand(-1, -1, history.shape[2])), token[..., None]], 2
        )
        finished = finished.gather(1, origin) | (torch.isin(token, stops) if stops.numel() else False)
        if bool(finished.all()) or step == max_steps - 1:
            break
        if beam_size > 1:  # with one beam, row j always continues row j
            cache.reorder(rows)
            keys, next_pos = keys[rows], next_pos[rows]
        if padded:
            keys = torch.cat([keys, torch.ones(rows.numel(), 1, dtype=torch.bool, device=device)], 1)
        logits = model(
            token.reshape(-1, 1),
            positions=next_pos[:, None],
            mask=keys[:, None, None, :] if padded else None,
            cache=cache.layers,
            last_only=True,
        )
        next_pos = next_pos + 1
    return GenerationOutput(history, scores)


@dataclass
class TextCompletions:
    """`complete_text`'s result: per prompt, its beams' (score, continuation text) best first, each cut at its
    first stop id (what follows is filler); and what the run took."""

    beams: list[list[tuple[float, str]]]
    steps: int
    tokens: int
    seconds: float


def complete_text(
    checkpoint: str | Path,
    prompts: Sequence[str],
    max_steps: int,
    *,
    min_steps: int = 0,
    beam_size: int = 1,
    per_node_beam_size: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    seed: int | None = None,
    stop_ids: Sequence[int] = (),
    device: str = "cpu",
) -> TextCompletions:
    """Text in, text out (`olmo-train generate`): the model of any checkpoint `load_model` reads, with the
    tokenizer its data was made with; greedy, sampled (any of temperature, top_k, top_p) or by beam search. The
    stop ids default to the tokenizer's EOS."""
    model, tokenizer = load_model(checkpoint, device=device_named(device))
    if tokenizer is None:
        raise DataError(f"{checkpoint}: no tokenizer found for this model, so text prompts cannot be encoded")
    sampler = None
    if temperature is not None or top_k is not None or top_p is not None:
        sampler = Sampling(temperature if temperature is not None else 1.0, top_k, top_p)
    stops = list(stop_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    t0 = time.perf_counter()
    out = generate(
        model,
        [tokenizer.encode(p) for p in prompts],
        max_steps,
        beam_size=beam_size,
        per_node_beam_size=per_node_beam_size,
        min_steps=min_steps,
        sampler=sampler,
        stop_ids=stops,
        seed=seed,
    )
    seconds = time.perf_counter() - t0
    beams = []
    for ids, scores in zip(out.token_ids.tolist(), out.scores.tolist(), strict=True):
        texts = []
        for beam, score in zip(ids, scores, strict=True):
            if any(s in beam for s in stops):
                beam = beam[: min(beam.index(s) for s in stops if s in beam)]
            texts.append((score, tokenizer.decode(beam)))
        beams.append(texts)
    steps = out.token_ids.shape[-1]
    return TextCompletions(beams, steps, out.token_ids.shape[0] * steps, seconds)


def trace_continuation(
    checkpoint: str | Path,
    text: str,
    *,
    config: str | None = None,
    min_tokens: int = 8,
    index_dir: str | None = None,
) -> SpansReport:
    """`generate --trace`: the spans of a generated text that the model's training data holds verbatim, with their
    documents and steps, so a reader can tell recall from composition. The run is the checkpoint's own config
    (or `config`: an imported model's original run); its suffix index is used when built."""
    run = config if config is not None else str(config_path(Path(checkpoint)))
    return trace_spans(run, text, min_tokens=min_tokens, index_dir=index_dir, progress=False)
