"""The plots of `envkit eval`'s report.html, drawn with matplotlib (the training lock holds it) as SVG: the
acceptance at each draft position, the per-prompt distribution, and the files side by side with the two rules."""

from __future__ import annotations

import io


def all_plots(result: dict, per_prompt: list[dict]) -> list[str]:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"
    drawn = [positions(plt, result), distribution(plt, result, per_prompt), by_file(plt, result)]
    plt.close("all")
    return drawn


def positions(plt, result: dict) -> str:
    figure, axes = plt.subplots(figsize=(7, 3.6))
    for name, figures in result["files"].items():
        curve = figures["walk_positions"]
        axes.plot(range(1, len(curve) + 1), curve, marker="o", label=name)
    axes.set(title="Acceptance per draft position", xlabel="draft position k",
             ylabel="forwards accepting positions 1..k", ylim=(0, 1.02))
    axes.legend(fontsize="small")
    axes.grid(alpha=0.3)
    return svg_of(figure)


def distribution(plt, result: dict, per_prompt: list[dict]) -> str:
    figure, axes = plt.subplots(figsize=(7, 3.6))
    block = result["block_size"]
    bins = [1 + i * (block - 1) / 24 for i in range(25)]
    for name in result["files"]:
        taus = [row["tau"] for row in per_prompt if row["file"] == name and not row["degenerate"]]
        axes.hist(taus, bins=bins, alpha=0.55, label=name)
    axes.set(title="Acceptance per prompt", xlabel="tau (accepted + 1 per target forward)", ylabel="prompts")
    axes.legend(fontsize="small")
    return svg_of(figure)


def by_file(plt, result: dict) -> str:
    names = list(result["files"])
    figure, axes = plt.subplots(figsize=(7, 3.6))
    width = 0.27
    for offset, (key, label) in enumerate((("walk_tau", "drafter"), ("walk_copy_tau", "copy rule"),
                                          ("walk_repeat_tau", "repeat rule"))):
        axes.bar([i + (offset - 1) * width for i in range(len(names))],
                 [result["files"][name][key] for name in names], width, label=label)
    axes.set_xticks(range(len(names)), names, fontsize="small")
    axes.set(title="Acceptance per file", ylabel="tau")
    axes.legend(fontsize="small")
    return svg_of(figure)


def svg_of(figure) -> str:
    """A matplotlib figure as inline SVG (text kept as text)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", bbox_inches="tight")
    text = buffer.getvalue()
    return text[text.index("<svg"):]
