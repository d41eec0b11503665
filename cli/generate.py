"""`olmo-train generate`: text from a checkpoint, greedy, sampled or by beam search."""

from __future__ import annotations

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
@click.option(
    "--trace", "trace_spans", is_flag=True, help="Mark the spans of each continuation found in the training data."
)
@click.option("--trace-config", default=None, help="The run whose data --trace searches [default: the checkpoint's].")
@click.option("--min-tokens", type=int, default=8, show_default=True, help="The shortest span --trace marks.")
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
    trace_spans: bool,
    trace_config: str | None,
    min_tokens: int,
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
      olmo-train generate runs/tiny/step100 --prompt "import os" --max-steps 40 --trace

    --trace marks each continuation's spans of at least --min-tokens tokens that the run's training data holds
    verbatim ([[ ]], or underlined on a terminal), and lists their documents and the steps that trained on them
    (as `olmo-data trace --spans`; fast once `olmo-data index` has indexed the run's token files).
    """
    from olmo_train.generate import complete_text

    out = complete_text(
        checkpoint,
        prompts,
        max_steps,
        min_steps=min_steps,
        beam_size=beam_size,
        per_node_beam_size=per_node_beam_size,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_ids=stop_ids,
        device=device,
    )
    for prompt, beams in zip(prompts, out.beams, strict=True):
        for rank, (score, text) in enumerate(beams if all_beams else beams[:1]):
            head = f"[beam {rank}, score {score:.3f}] " if all_beams else ""
            if not ((trace_spans or trace_config) and text.strip()):
                click.echo(f"{head}{prompt}{text}")
                continue
            from olmo_data.trace import marked_text
            from olmo_train.generate import trace_continuation

            found = trace_continuation(checkpoint, text, config=trace_config, min_tokens=min_tokens)
            click.echo(f"{head}{prompt}{marked_text(found)}")
            if not found.spans:
                click.echo(f"  no span of {min_tokens} tokens or more of it is in the training data (nothing marked)")
            for span in found.spans:
                docs = sorted({f"{d['id']} ({d['src']}:{d['loc']})" for p in span.places for d in p.documents})
                steps = ", ".join(map(str, span.steps[:10])) + (" ..." if len(span.steps) > 10 else "")
                click.echo(
                    f"  in the training data: {span.text!r} ({span.end - span.start} tokens): "
                    f"{', '.join(docs[:3]) or 'no metadata'}{' ...' if len(docs) > 3 else ''}; "
                    f"steps {steps or '(none in the run)'}"
                )
    click.echo(
        f"generated {out.steps} steps for {len(prompts)} prompt(s), beam size {beam_size}, in "
        f"{out.seconds:.2f} s ({out.tokens / max(out.seconds, 1e-9):.1f} tokens/s)",
        err=True,
    )
