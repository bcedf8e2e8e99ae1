"""`envkit eval --out DIR`: eval.json (every figure), per_prompt.csv (one row a prompt) and report.html (the
figures and their plots in one file: the SVG inline, no script, nothing fetched, so it opens offline). DIR is
written whole or not at all: the files go to a temporary sibling, renamed into place."""

from __future__ import annotations

import csv
import html
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from trainer.common.errors import TrainerInputError
from trainer.common.files import follow_umask

CSV_FIELDS = ("file", "index", "prompt_tokens", "tau", "copy_tau", "repeat_tau", "degenerate", "prompt_end")


def require_plotting() -> None:
    """Fails before any work when the venv cannot draw the report's plots."""
    if importlib.util.find_spec("matplotlib") is None:
        raise TrainerInputError("report.html needs matplotlib, which this venv lacks: recreate it from a profile "
                                "that locks it (`envkit create --profile cpu`), or leave out --out")


def check_out(out: Path) -> None:
    if out.is_symlink() or (out.exists() and (not out.is_dir() or any(out.iterdir()))):
        raise TrainerInputError(f"--out {out} exists and is not an empty directory; name a new one")
    if not out.parent.is_dir():
        raise TrainerInputError(f"--out {out}: its parent directory does not exist")


def write(out: Path, result: dict, per_prompt: list[dict]) -> None:
    out = Path(out).absolute()
    check_out(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        (tmp / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
        with (tmp / "per_prompt.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, CSV_FIELDS)
            writer.writeheader()
            writer.writerows(per_prompt)
        (tmp / "report.html").write_text(render_html(result, per_prompt))
        follow_umask(tmp)
        if out.exists():
            out.rmdir()  # empty, checked above
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def render_html(result: dict, per_prompt: list[dict]) -> str:
    from trainer.eval import report_plots

    files = result["files"]
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{f['walk_tau']:.2f}</td><td>{f['walk_median_tau']:.2f}</td>"
        f"<td>{f['walk_copy_tau']:.2f}</td><td>{f['walk_repeat_tau']:.2f}</td><td>{f['walk_counted']}</td>"
        f"<td>{f['walk_degenerate']}</td><td>{result['speedup'][name]['drafter']:.2f}x</td>"
        f"<td>{result['speedup'][name]['copy']:.2f}x</td></tr>" for name, f in files.items())
    cost = result["cost"]
    worst = "".join(_worst_html(name, f["worst"]) for name, f in files.items())
    plots = "".join(f"<figure>{svg}</figure>" for svg in report_plots.all_plots(result, per_prompt))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>envkit eval: {html.escape(result['source'])}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}pre{{background:#f6f6f6;padding:8px;overflow-x:auto}}
figure{{margin:1em 0}}</style></head><body>
<h1>Drafter acceptance: {html.escape(result['source'])}</h1>
<p>{html.escape(result['kind'])}, step {result['step']}; {result['new_tokens']} new tokens a prompt, block size
{result['block_size']}; greedy speculative decoding walk (accepted + 1 per target forward, mean of per-prompt means).
Prompts the target continues degenerately are counted and left out.</p>
<table id="figures"><tr><th>file</th><th>tau</th><th>median</th><th>copy rule</th><th>repeat rule</th><th>prompts</th>
<th>degenerate</th><th>est. speedup</th><th>copy est.</th></tr>{rows}</table>
<p>Estimate on {html.escape(cost['device'])}: <code>{html.escape(cost['formula'])}</code>, t_decode
{cost['t_decode_s'] * 1e3:.2f} ms, t_verify {cost['t_verify_s'] * 1e3:.2f} ms, t_draft {cost['t_draft_s'] * 1e3:.2f} ms
(medians, a {cost['prompt_tokens']}-token prompt).</p>
{_reference_html(result.get("reference_dflash") or {})}
{plots}
<h2>Lowest acceptance</h2>{worst}
</body></html>
"""


def _reference_html(reference: dict) -> str:
    if not reference.get("installed"):
        return ""
    return (f"<p id=\"reference\">The reference dflash {html.escape(str(reference['installed']))} decoded the first "
            f"{reference['prompts']} prompts: tau {reference['tau']:.2f}, {reference['equal_to_target_greedy']} equal to "
            f"the target's greedy decoding, {reference['tokens_per_s']:.1f} tokens/s against the target's own "
            f"{reference['target_tokens_per_s']:.1f} (measured speedup {reference['speedup']:.2f}x).</p>")


def _worst_html(name: str, worst: list[dict]) -> str:
    parts = []
    for entry in worst:
        lines = entry.get("walk") or [f"forward {i + 1}: drafted {s['drafted']} accepted {s['accepted']} target "
                                      f"{s['target']}" for i, s in enumerate(entry["steps"])]
        parts.append(f"<h3>{html.escape(name)}, prompt {entry['index']}: tau {entry['tau']:.2f}</h3>"
                     f"<pre>{html.escape(chr(10).join(lines))}</pre>")
    return "".join(parts)

