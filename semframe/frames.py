"""The edge where pandas and Polars meet the frame-neutral core.

Each supported frame library has one small adapter: read the named columns
into a :class:`~semframe.table.Table` once, and build the result frame once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from semframe.errors import InputError
from semframe.table import Table, as_table, unsupported_frame


class FrameAdapter(Protocol):
    """What the operators need from a frame library."""

    def columns(self, frame: Any) -> list[str]:
        """Column names as strings."""
        ...

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        """Rendered text of ``columns``."""
        ...

    def labels(self, frame: Any) -> list[object]:
        """Row labels for messages (index labels, or positions)."""
        ...

    def with_column(self, frame: Any, name: str, values: Sequence[Any], dtype: str) -> Any:
        """A new frame with column ``name`` (``dtype`` is ``"str"`` or ``"bool"``)."""
        ...

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        """A new frame with the rows at ``positions``, in that order, labels kept."""
        ...


class PandasAdapter:
    """pandas in, pandas out; the index (any kind, duplicates too) is kept."""

    def columns(self, frame: Any) -> list[str]:
        names = [str(c) for c in frame.columns]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            msg = f"the frame has duplicate column names {dupes}; rename them first."
            raise InputError(msg)
        return names

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        return as_table(frame, columns)

    def labels(self, frame: Any) -> list[object]:
        return list(frame.index)

    def with_column(self, frame: Any, name: str, values: Sequence[Any], dtype: str) -> Any:
        import pandas as pd

        out = frame.copy(deep=False)
        kind = "boolean" if dtype == "bool" else "object"
        out[name] = pd.Series(list(values), index=frame.index, dtype=kind)
        return out

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        return frame.iloc[list(positions)]


class PolarsAdapter:
    """Polars in, Polars out (a LazyFrame is collected, and the result made lazy again)."""

    def columns(self, frame: Any) -> list[str]:
        return list(frame.columns)

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        return as_table(frame, columns)

    def labels(self, frame: Any) -> list[object]:
        return list(range(frame.height))

    def with_column(self, frame: Any, name: str, values: Sequence[Any], dtype: str) -> Any:
        import polars as pl

        kind = pl.Boolean if dtype == "bool" else pl.String
        return frame.with_columns(pl.Series(name, list(values), dtype=kind))

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        import polars as pl

        return frame[pl.Series(list(positions), dtype=pl.Int64)] if positions else frame.head(0)


def is_lazy(frame: object) -> bool:
    """Whether ``frame`` is a Polars LazyFrame."""
    return type(frame).__module__.startswith("polars") and type(frame).__name__ == "LazyFrame"


def adapter_for(frame: object) -> FrameAdapter:
    """The adapter of ``frame``'s library.

    Raises
    ------
    InputError
        For any other object, naming the supported types.
    """
    module = type(frame).__module__.split(".")[0]
    name = type(frame).__name__
    if module == "pandas" and name == "DataFrame":
        return PandasAdapter()
    if module == "polars" and name == "DataFrame":
        return PolarsAdapter()
    raise unsupported_frame(frame)
