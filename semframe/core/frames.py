"""The edge where pandas and Polars meet the frame-neutral core.

Each supported frame library has one small adapter: read the named columns
into a :class:`~semframe.core.table.Table` once, and build the result frame once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from semframe.core.table import Table, as_table, unsupported_frame
from semframe.errors import InputError

DTYPES = ("str", "bool", "int", "float", "list[str]")
"""Output column dtypes: pandas ``object``/``boolean``/``Int64``/``Float64``/
``object``; Polars ``String``/``Boolean``/``Int64``/``Float64``/``List(String)``.
All of them hold missing values."""


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
        """A new frame with column ``name``; ``dtype`` is one of :data:`DTYPES`.

        ``None`` in ``values`` is a missing value, whatever the dtype.
        """
        ...

    def select(self, frame: Any, columns: Sequence[str]) -> Any:
        """A new frame with only ``columns``, in that order (labels kept)."""
        ...

    def rename(self, frame: Any, mapping: Mapping[str, str]) -> Any:
        """A new frame with columns renamed by ``mapping``."""
        ...

    def hconcat(self, left: Any, right: Any) -> Any:
        """Columns of ``left`` then ``right`` side by side (equal heights).

        The result has fresh positional labels (pandas: a ``RangeIndex``).
        """
        ...

    def height(self, frame: Any) -> int:
        """Number of rows."""
        ...

    def reset_labels(self, frame: Any) -> Any:
        """The frame with fresh positional labels (pandas: a ``RangeIndex``)."""
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
        kind = {"bool": "boolean", "int": "Int64", "float": "Float64"}.get(dtype, "object")
        out[name] = pd.Series(list(values), index=frame.index, dtype=kind)
        return out

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        return frame.iloc[list(positions)]

    def select(self, frame: Any, columns: Sequence[str]) -> Any:
        by_name = {str(c): c for c in frame.columns}
        return frame[[by_name[c] for c in columns]]

    def rename(self, frame: Any, mapping: Mapping[str, str]) -> Any:
        return frame.rename(columns={c: mapping.get(str(c), c) for c in frame.columns})

    def hconcat(self, left: Any, right: Any) -> Any:
        import pandas as pd

        return pd.concat([left.reset_index(drop=True), right.reset_index(drop=True)], axis=1)

    def height(self, frame: Any) -> int:
        return len(frame)

    def reset_labels(self, frame: Any) -> Any:
        return frame.reset_index(drop=True)


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

        kinds = {"bool": pl.Boolean, "int": pl.Int64, "float": pl.Float64}
        kind = pl.List(pl.String) if dtype == "list[str]" else kinds.get(dtype, pl.String)
        return frame.with_columns(pl.Series(name, list(values), dtype=kind))

    def take(self, frame: Any, positions: Sequence[int]) -> Any:
        import polars as pl

        return frame[pl.Series(list(positions), dtype=pl.Int64)] if positions else frame.head(0)

    def select(self, frame: Any, columns: Sequence[str]) -> Any:
        return frame.select(list(columns))

    def rename(self, frame: Any, mapping: Mapping[str, str]) -> Any:
        present = {k: v for k, v in mapping.items() if k in frame.columns}
        return frame.rename(present)

    def hconcat(self, left: Any, right: Any) -> Any:
        import polars as pl

        return pl.concat([left, right], how="horizontal")

    def height(self, frame: Any) -> int:
        return int(frame.height)

    def reset_labels(self, frame: Any) -> Any:
        return frame


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
