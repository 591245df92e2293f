"""Derived relQueries whose rows are not rows of the caller's frame.

``agg`` sends chunks of rows, ``topk`` comparisons between two rows, ``join``
pairs of rows. Each is still one relQuery run with ``run_call``; this module
gives such a call a "frame" whose row labels say what each request stands for,
so that errors name the caller's rows (``"chunk 2 of group 'Alien' (rows 3-7)"``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from semframe.config import ResolvedConfig
from semframe.core.plan import Plan
from semframe.core.table import Table
from semframe.errors import InputError
from semframe.runtime.call import Call


@dataclass(frozen=True)
class Parts:
    """The rows of a derived relQuery, known only by their labels."""

    labels: tuple[object, ...]


class PartsAdapter:
    """A :class:`~semframe.core.frames.FrameAdapter` over :class:`Parts`: labels, no columns."""

    def columns(self, frame: Any) -> list[str]:
        return []

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        if columns:
            raise _no_columns()
        return Table((), {}, len(frame.labels))

    def labels(self, frame: Any) -> list[object]:
        return list(frame.labels)

    def with_column(self, frame: Any, name: str, values: Sequence[Any], dtype: str) -> Any:
        raise _no_columns()

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        return Parts(tuple(frame.labels[i] for i in positions))

    def select(self, frame: Any, columns: Sequence[str]) -> Any:
        if columns:
            raise _no_columns()
        return frame

    def rename(self, frame: Any, mapping: Mapping[str, str]) -> Any:
        return frame

    def hconcat(self, left: Any, right: Any) -> Any:
        raise _no_columns()

    def height(self, frame: Any) -> int:
        return len(frame.labels)

    def reset_labels(self, frame: Any) -> Any:
        return Parts(tuple(range(len(frame.labels))))


def _no_columns() -> InputError:
    msg = "internal: derived relQuery rows (chunks, comparisons, pairs) have no columns"
    return InputError(msg)


def parts_call(labels: Sequence[object], settings: ResolvedConfig, plan: Plan) -> Call:
    """A :class:`~semframe.runtime.call.Call` for a derived relQuery with one label per row."""
    return Call(Parts(tuple(labels)), PartsAdapter(), settings, plan)
