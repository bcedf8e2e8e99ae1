"""`envkit eval`: a trained drafter's acceptance on the user's own prompts, and what it is worth when served."""

from __future__ import annotations

import click

from envkit.cli.app import main, print_json
from envkit.cli.options import profile_option, venv_option


@main.command("eval")
@click.argument("source", metavar="RUN|EXPORT_DIR")
@click.option("--prompts", multiple=True, required=True, metavar="FILE",
              help="JSONL prompts: prompt or text strings, or conversations (rendered with the run's chat template "
                   "kwargs). Repeat for several kinds of traffic: one walk, one row, a file.")
@click.option("--target", metavar="DIR", help="The target model dir (default: the one the drafter trained with; an "
                                              "export's own target/).")
@click.option("--new-tokens", type=click.IntRange(min=2), metavar="N", help="Tokens generated a prompt (default: "
                                                                          "the run's walk_new_tokens).")
@click.option("--max-prompts", type=click.IntRange(min=0), default=0, metavar="N",
              help="Evaluate the first N prompts of each file (default: all).")
@click.option("--out", metavar="DIR", help="Write eval.json, per_prompt.csv and report.html (opens offline) to this "
                                           "new directory.")
@venv_option
@profile_option
@click.option("--runs-dir", type=click.Path(file_okay=False), metavar="DIR")
@click.option("--allow-warn", is_flag=True, help="Evaluate despite doctor warnings.")
@click.option("--json", "as_json", is_flag=True, help="Print every figure as one JSON object.")
def eval_command(source, prompts, target, new_tokens, max_prompts, out, venv_path, profile_name, runs_dir,
                 allow_warn, as_json):
    """Walk a drafter on your prompts: acceptance per file, per prompt and per draft position, checked lossless.

    RUN is a name from `envkit runs` or a run dir (its checkpoint, in its own venv); EXPORT_DIR a directory
    `envkit export` wrote, evaluated as a server loads it (in --venv, or the profile's venv). Each file is
    walked with greedy speculative decoding beside the copy and repeat rules; the first prompts are also
    decoded block by block with the target verifying every block. The speedup is an estimate from the
    measured cost of a drafter and a target step on this machine (docs/cli.md gives the formula).
    """
    from envkit.run.evaluate import EvalRequest, describe, evaluate
    from envkit.support.text import printable

    result = evaluate(EvalRequest(source, tuple(prompts), target, new_tokens, max_prompts, out, venv_path,
                                  profile_name, runs_dir, allow_warn))
    if as_json:
        return print_json(result)
    for line in describe(result):
        click.echo(line)
    if out:
        click.echo(printable(f"report: {out}/report.html (eval.json, per_prompt.csv beside it)"))
