"""Draw a GGR ordering of a small table for ``docs/reordering.md``.

Left: the table in its own order, fields in the template's order. Right: the
order GGR executes, rows and each row's fields. A cell is shaded when it, and
every cell before it in its row, equals the previous executed row at the same
position: that is the prefix a cache serves. Same value, same colour.

    python benchmarks/ggr_picture.py   # writes docs/img/ggr_ordering.png
"""

from __future__ import annotations

import itertools
from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from semframe.core.ordering import Ordering
from semframe.reorder import evaluate, ggr

OUT = Path(__file__).resolve().parents[1] / "docs" / "img" / "ggr_ordering.png"

ALIEN = "Alien: a crew meets a deadly creature"
HEAT = "Heat: a thief and a detective in LA"
UP = "Up: an old man flies his house away"
TABLE = pd.DataFrame(
    {
        "review": [
            "Tense.",
            "A slog.",
            "Great fun.",
            "Too long.",
            "Moving.",
            "Dull.",
            "Sharp.",
            "Loved it.",
            "Lovely.",
        ],
        "critic": [
            "Ann Lee, Chicago Daily",
            "Bo Park, Film Weekly Review",
            "Ann Lee, Chicago Daily",
            "Cy Diaz",
            "Bo Park, Film Weekly Review",
            "Cy Diaz",
            "Bo Park, Film Weekly Review",
            "Dee Moss",
            "Bo Park, Film Weekly Review",
        ],
        "movie": [ALIEN, HEAT, ALIEN, HEAT, UP, ALIEN, "Ran", UP, "Big"],
    }
)


def hits(cells: list[list[tuple[str, str]]]) -> list[int]:
    """Leading cells of each row equal to the previous row's at the same position."""
    out = [0]
    for prev, row in itertools.pairwise(cells):
        n = 0
        while n < min(len(prev), len(row)) and prev[n] == row[n]:
            n += 1
        out.append(n)
    return out


def draw(ax: plt.Axes, title: str, cells: list[list[tuple[str, str]]], rows: list[int]) -> None:
    colours = plt.get_cmap("tab20")
    values = sorted({v for row in cells for _, v in row})
    colour = {v: colours(i % 20) for i, v in enumerate(values)}
    widths = [5.0, 5.0, 5.0]
    n_hit = hits(cells)
    for i, row in enumerate(cells):
        x = 0.0
        for j, (col, value) in enumerate(row):
            w = widths[j]
            hit = j < n_hit[i]
            ax.add_patch(
                plt.Rectangle(
                    (x, -i),
                    w,
                    0.9,
                    facecolor=colour[value] if hit else "white",
                    edgecolor=colour[value],
                    linewidth=2,
                )
            )
            ax.text(x + 0.1, -i + 0.45, f"{col}: {value}", va="center", fontsize=6.5)
            x += w
        ax.text(-0.2, -i + 0.45, f"row {rows[i]}", va="center", ha="right", fontsize=7)
    ax.set_xlim(-1.5, sum(widths) + 0.1)
    ax.set_ylim(-len(cells) + 0.8, 1.2)
    ax.set_title(title, fontsize=9)
    ax.axis("off")


def main() -> None:
    cols = list(TABLE.columns)
    o = ggr(TABLE)
    none = Ordering.identity(len(TABLE), cols)
    fig, axes = plt.subplots(1, 2, figsize=(15.5, 4.2))
    for ax, ordering, name in ((axes[0], none, "file order"), (axes[1], o, "GGR")):
        cells = [
            [(c, str(TABLE.iloc[r][c])) for c in fields]
            for r, fields in zip(ordering.rows.tolist(), ordering.fields, strict=True)
        ]
        score = evaluate(TABLE, ordering)
        title = f"{name}: {score.hit_rate:.0%} of field characters served from the previous prompt"
        draw(ax, title, cells, ordering.rows.tolist())
    fig.suptitle(
        "Shaded: the prefix each prompt shares with the one before it (same colour, same value)",
        fontsize=9,
    )
    fig.tight_layout()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=130)
    print(f"wrote {OUT}")
    for r, f in zip(o.rows, o.fields, strict=True):
        print(r, f)


if __name__ == "__main__":
    main()
