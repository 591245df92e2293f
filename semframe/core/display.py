"""What notebooks show: HTML tables of plain text, and matplotlib when a plot is asked for.

The ``_repr_html_`` of plans, estimates, run statistics and row errors build
their tables here, every piece of text escaped (cells hold the caller's
data). matplotlib is optional: :func:`pyplot` imports it only when a
``plot()`` is called, and fails with the install line when it is missing.

Examples
--------
>>> print(html_table([("rows", "3"), ("  <b>", "a & b")], head=("", "value")))
<table><thead><tr><th></th><th>value</th></tr></thead><tbody><tr><td style='text-align:left'>rows</td><td>3</td></tr><tr><td style='text-align:left;padding-left:1.5em'>&lt;b&gt;</td><td>a &amp; b</td></tr></tbody></table>
"""  # noqa: E501

from __future__ import annotations

from collections.abc import Sequence
from html import escape
from typing import Any

from semframe.errors import MissingDependencyError

__all__ = ["html_table", "pyplot"]

MATPLOTLIB_INSTALL = "pip install matplotlib"
"""The install line :func:`pyplot` names (no extra of semframe holds matplotlib)."""


def html_table(
    rows: Sequence[Sequence[str]], *, head: Sequence[str] | None = None, left: int = 1
) -> str:
    """An HTML table of text cells, each escaped; the first ``left`` columns left-aligned.

    Parameters
    ----------
    rows : sequence of sequence of str
        The cells, row by row.
    head : sequence of str, optional
        Column headings.
    left : int
        How many leading columns hold words (left-aligned); the rest hold
        figures and keep the notebook's right alignment.
    """

    def cell(tag: str, i: int, text: str) -> str:
        styles = ["text-align:left"] if i < left else []
        indent = len(text) - len(text.lstrip(" "))
        if indent:  # a sub-row ("  cached"): HTML would drop the spaces
            styles.append(f"padding-left:{indent / 2 + 0.5:g}em")
        style = f" style='{';'.join(styles)}'" if styles else ""
        return f"<{tag}{style}>{escape(text.lstrip(' '))}</{tag}>"

    thead = ""
    if head is not None:
        thead = "<thead><tr>" + "".join(f"<th>{escape(h)}</th>" for h in head) + "</tr></thead>"
    body = "".join(
        "<tr>" + "".join(cell("td", i, c) for i, c in enumerate(row)) + "</tr>" for row in rows
    )
    return f"<table>{thead}<tbody>{body}</tbody></table>"


def pyplot(what: str) -> Any:
    """``matplotlib.pyplot``, imported now; ``what`` names the caller in the error.

    Raises
    ------
    MissingDependencyError
        matplotlib is not installed; the message gives the install line.
    """
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        msg = f"{what} needs matplotlib, which is not installed: {MATPLOTLIB_INSTALL}"
        raise MissingDependencyError(msg) from exc
    return plt
