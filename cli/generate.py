"""`olmo-train generate`: text from a checkpoint, greedy, sampled or by beam search."""

from __future__ import annotations

import time

import click

from olmo_cli.options import Command


@click.command("generate", cls=Command)
@click.argument("checkpoint")
@click.option("--prompt", "prompts", multiple=True, required=True, help="Text to continue; repeat for a batch.")
@click.option("--max-steps", type=int, default=64, show_default=True, help="Tokens to generate at most.")
@click.option("--min-steps", type=int, default=0, show_default=True, help="No stop token before this many tokens.")
@click.option("--beam-size", type=int, default=1, show_default=True, help="Beams kept per prompt (1: no beam search).")
@click.option("--per-node-beam-size", type=int, default=None, help="Candidates per beam and step [default: beam size].")
@click.option("--temperature", type=float, default=None, help="Sample instead of taking the most likely token.")
@click.option("--top-k", type=int, default=None, help="Sample among the K most likely tokens only.")
@click.option("--top-p", type=float, default=None, help="Sample among the most likely tokens of total probability P.")
@click.option("--seed", type=int, default=None, help="Seed of the sampling generator: a seed reproduces a sample.")
@click.option(
    "--stop-id", "stop_ids", type=int, multiple=True, help="Token id that ends a continuation [default: the EOS id]."
)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--all-beams", is_flag=True, help="Print every beam with its score, not only the best.")
def generate(
    checkpoint: str,
    prompts: tuple[str, ...],
    max_steps: int,
    min_steps: int,
    beam_size: int,
    per_node_beam_size: int | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    stop_ids: tuple[int, ...],
    device: str,
    all_beams: bool,
) -> None:
    """Continue each --prompt with the model of CHECKPOINT and print the text.

    CHECKPOINT is a checkpoint directory the trainer wrote (stepN or stepN-unsharded), one `import-hf` made, a
    `transformers` model directory, or a checkpoint URL. The tokenizer is the one the run's data was tokenized
    with (its data manifest records it).

    \b
    Examples:
      olmo-train generate runs/tiny/step100 --prompt "def main(" --max-steps 40
      olmo-train generate runs/tiny/step100 --prompt "import os" --beam-size 4 --all-beams
      olmo-train generate runs/tiny/step100 --prompt "class " --temperature 0.8 --top-p 0.95 --seed 1
    """
    from olmo_data.errors import DataError
    from olmo_train.convert import load_model
    from olmo_train.generate import Sampling, generate

    model, tokenizer = load_model(checkpoint, device=device)
    if tokenizer is None:
        raise DataError(f"{checkpoint}: no tokenizer found for this model, so text prompts cannot be encoded")
    sampler = None
    if temperature is not None or top_k is not None or top_p is not None:
        sampler = Sampling(temperature if temperature is not None else 1.0, top_k, top_p)
    stops = list(stop_ids) or ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])
    encoded = [tokenizer.encode(p) for p in prompts]
    t0 = time.perf_counter()
    out = generate(
        model,
        encoded,
        max_steps,
        beam_size=beam_size,
        per_node_beam_size=per_node_beam_size,
        min_steps=min_steps,
        sampler=sampler,
        stop_ids=stops,
        seed=seed,
    )
    seconds = time.perf_counter() - t0
    for prompt, ids, scores in zip(prompts, out.token_ids.tolist(), out.scores.tolist(), strict=True):
        for rank, (beam, score) in enumerate(zip(ids, scores, strict=True)):
            if rank and not all_beams:
                break
            if stops and any(s in beam for s in stops):  # what follows the first stop id is filler
                beam = beam[: min(beam.index(s) for s in stops if s in beam)]
            head = f"[beam {rank}, score {score:.3f}] " if all_beams else ""
            click.echo(f"{head}{prompt}{tokenizer.decode(beam)}")
    tokens = out.token_ids.shape[0] * out.token_ids.shape[-1]
    click.echo(
        f"generated {out.token_ids.shape[-1]} steps for {len(prompts)} prompt(s), beam size {beam_size}, in "
        f"{seconds:.2f} s ({tokens / max(seconds, 1e-9):.1f} tokens/s)",
        err=True,
    )
