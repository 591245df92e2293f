"""The edge where pandas and Polars meet the frame-neutral core.

A caller's frame is converted once on the way in and once on the way out.
:meth:`Frame.of` wraps it (a LazyFrame is collected) with its library's
adapter; operators read the columns they need as a
:class:`~semframe.core.table.Table` and the row labels, and describe their
result as an :class:`Output` (which input rows, which new columns), which
:meth:`Frame.build` turns into one frame of the caller's library. Nothing
behind the edge holds a DataFrame.

Each supported library has one small adapter (:class:`PandasAdapter`,
:class:`PolarsAdapter`); subclasses of their frames are served by them too.

A Polars LazyFrame need not be collected at call time: :func:`schema_only`
gives an empty frame of its schema (an operator call is validated and its
result typed on that), and :func:`defer` puts a function of the whole
collected frame at the end of its plan, run when the caller collects.
"""

from __future__ import annotations

import functools
import re
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from semframe.core.table import Table, from_pandas, from_polars, unsupported_frame
from semframe.errors import InputError

__all__ = [
    "DTYPES",
    "Frame",
    "FrameAdapter",
    "NewColumn",
    "Output",
    "PandasAdapter",
    "PolarsAdapter",
    "RightSide",
    "adapter_for",
    "defer",
    "errors_pass_through",
    "is_lazy",
    "schema_only",
]

DTYPES = ("str", "bool", "int", "float", "list[str]")
"""Output column dtypes: pandas ``object``/``boolean``/``Int64``/``Float64``/
``object``; Polars ``String``/``Boolean``/``Int64``/``Float64``/``List(String)``.
All of them hold missing values."""


@dataclass(frozen=True)
class NewColumn:
    """A column an operator adds: one value per result row (``None``: missing)."""

    name: str
    values: Sequence[Any]
    dtype: str = "str"


@dataclass(frozen=True)
class RightSide:
    """The other frame of a join: its rows beside each result row, renamed columns.

    Attributes
    ----------
    frame : Frame
        The right frame.
    rows : sequence of int
        Its row beside each result row.
    rename : mapping of str to str
        Right columns renamed (those the left frame also has).
    """

    frame: Frame
    rows: Sequence[int]
    rename: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Output:
    """An operator's result, frame-neutral: built into a frame once, at the edge.

    Attributes
    ----------
    rows : sequence of int or None
        Positions of the input's rows in the result, in result order (``None``:
        every row, in order). Row labels are kept.
    keep : sequence of str or None
        Input columns kept, in this order, before the new ones (``None``: all).
    columns : tuple of NewColumn
        Columns added after them, aligned with the result's rows.
    fresh_labels : bool
        The result gets positional labels (pandas: a fresh ``RangeIndex``).
    right : RightSide or None
        A join's right side, placed after the kept columns (fresh labels).
    """

    rows: Sequence[int] | None = None
    keep: Sequence[str] | None = None
    columns: tuple[NewColumn, ...] = ()
    fresh_labels: bool = False
    right: RightSide | None = None

    def with_columns(self, *columns: NewColumn) -> Output:
        """The same output with ``columns`` added after its own."""
        return Output(
            self.rows, self.keep, (*self.columns, *columns), self.fresh_labels, self.right
        )


class FrameAdapter(Protocol):
    """What the edge needs from a frame library."""

    def columns(self, frame: Any) -> list[str]:
        """Column names as strings."""
        ...

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        """Rendered text of ``columns``."""
        ...

    def labels(self, frame: Any) -> Sequence[object]:
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
            # One pass (Counter), not names.count per name: wide frames stay fast.
            dupes = sorted(n for n, k in Counter(names).items() if k > 1)
            msg = f"the frame has duplicate column names {dupes}; rename them first."
            raise InputError(msg)
        return names

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        return from_pandas(frame, columns)

    def labels(self, frame: Any) -> Sequence[object]:
        import pandas as pd

        index = frame.index
        if type(index) is pd.RangeIndex:  # positions: held as a range, not a label per row
            return range(index.start, index.stop, index.step)
        labels: list[object] = index.tolist()
        return labels

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
    """Polars in, Polars out (a LazyFrame wrapped by :meth:`Frame.of` is collected first)."""

    def columns(self, frame: Any) -> list[str]:
        return list(frame.columns)

    def to_table(self, frame: Any, columns: Sequence[str]) -> Table:
        return from_polars(frame, columns)

    def labels(self, frame: Any) -> Sequence[object]:
        return range(frame.height)

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
    """Whether ``frame`` is a Polars LazyFrame (or a subclass of one)."""
    pl = sys.modules.get("polars")
    return pl is not None and isinstance(frame, pl.LazyFrame)


def schema_only(frame: Any) -> Any:
    """An empty ``polars.DataFrame`` with the columns and dtypes of LazyFrame ``frame``.

    Only the schema is resolved (``collect_schema``): nothing in ``frame``'s
    plan runs (a function put there by :func:`defer` included).

    Examples
    --------
    >>> import polars as pl
    >>> schema_only(pl.LazyFrame({"a": [1, 2]}).with_columns(b=pl.col("a") > 1))
    shape: (0, 2)
    ┌─────┬──────┐
    │ a   ┆ b    │
    │ --- ┆ ---  │
    │ i64 ┆ bool │
    ╞═════╪══════╡
    └─────┴──────┘
    """
    import polars as pl

    return pl.DataFrame(schema=frame.collect_schema())


def defer(frame: Any, function: Callable[[Any], Any], schema: Any) -> Any:
    """LazyFrame ``frame`` followed by ``function``, run when the result is collected.

    ``function`` gets the whole collected frame at once, never a batch of it
    (even under ``collect(engine="streaming")``), and must return a
    ``polars.DataFrame`` of ``schema`` (Polars checks it). No optimisation
    passes it: a filter, projection or slice after it does not change what it
    is given.

    An exception ``function`` raises comes out of ``collect()`` as it is
    (Polars 1.30 and later; see :func:`errors_pass_through` for earlier ones).

    Examples
    --------
    >>> import polars as pl
    >>> seen = []
    >>> def count(df):
    ...     seen.append(df.height)
    ...     return df.with_columns(n=pl.lit(df.height, dtype=pl.Int64))
    >>> lf = defer(pl.LazyFrame({"a": [1, 2, 3]}), count, {"a": pl.Int64, "n": pl.Int64})
    >>> seen
    []
    >>> lf.head(1).collect().row(0), seen
    ((1, 3), [3])
    """
    return frame.map_batches(
        function if errors_pass_through() else _explained(function),
        schema=schema,
        predicate_pushdown=False,
        projection_pushdown=False,
        slice_pushdown=False,
        validate_output_schema=True,
        streamable=False,
    )


def errors_pass_through() -> bool:
    """Whether the installed Polars raises a :func:`defer`-red function's error as it is.

    Polars 1.30 and later do. Earlier ones raise a
    ``polars.exceptions.ComputeError`` instead, whose message quotes the error
    but which holds neither the error object nor its attributes (a
    ``RowErrors``' ``result``): :func:`defer` then raises a ``RuntimeError``
    naming the error's type, its message and that limitation.
    """
    import polars as pl

    found = re.match(r"(\d+)\.(\d+)", pl.__version__)
    return found is None or (int(found[1]), int(found[2])) >= (1, 30)


def _explained(function: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``function``, its errors restated for a Polars that wraps them (before 1.30)."""

    def run(frame: Any) -> Any:
        try:
            return function(frame)
        except Exception as exc:
            import polars as pl

            msg = (
                f"{type(exc).__name__}: {exc}\n(raised while collecting; Polars "
                f"{pl.__version__} wraps errors raised there in a ComputeError that keeps "
                "only this message, not the error's attributes such as `.result`: "
                "Polars 1.30 or later raises the error itself)"
            )
            raise RuntimeError(msg) from exc

    return run


def adapter_for(frame: object) -> FrameAdapter:
    """The adapter of ``frame``'s library (subclasses of its frame type included).

    Raises
    ------
    InputError
        For any other object, naming the supported types.
    """
    pd, pl = sys.modules.get("pandas"), sys.modules.get("polars")
    if pd is not None and isinstance(frame, pd.DataFrame):
        return PandasAdapter()
    if pl is not None and isinstance(frame, pl.DataFrame):
        return PolarsAdapter()
    raise unsupported_frame(frame)


@dataclass(frozen=True, eq=False)
class Frame:
    """A caller's frame at the edge: read through its library's adapter, built back once.

    Attributes
    ----------
    data : object
        The eager frame (a LazyFrame collected).
    adapter : FrameAdapter
        Its library's adapter.
    lazy : bool
        The caller passed a LazyFrame, collected here: the result is made lazy
        again (``plan``, ``estimate`` and operators that are not deferred; see
        :mod:`semframe.operators.lazy`).

    Examples
    --------
    >>> import pandas as pd
    >>> f = Frame.of(pd.DataFrame({"a": ["x", "y"]}, index=[10, 20]))
    >>> f.columns, f.labels
    (('a',), (10, 20))
    >>> f.build(Output(rows=[1], columns=(NewColumn("b", [True], "bool"),)))
        a     b
    20  y  True
    """

    data: Any
    adapter: FrameAdapter
    lazy: bool = False

    @classmethod
    def of(cls, frame: object) -> Frame:
        """Wrap ``frame`` (a Frame is returned as it is).

        Raises
        ------
        InputError
            For an object that is not a supported frame.
        """
        if isinstance(frame, Frame):
            return frame
        lazy = is_lazy(frame)
        data = frame.collect() if lazy else frame  # type: ignore[attr-defined]
        return cls(data, adapter_for(data), lazy)

    @functools.cached_property
    def columns(self) -> tuple[str, ...]:
        """Column names as strings."""
        return tuple(self.adapter.columns(self.data))

    @functools.cached_property
    def labels(self) -> Sequence[object]:
        """Row labels (index labels, or positions): an immutable sequence."""
        labels = self.adapter.labels(self.data)
        return labels if isinstance(labels, range) else tuple(labels)

    @property
    def height(self) -> int:
        """Number of rows."""
        return self.adapter.height(self.data)

    def table(self, columns: Sequence[str]) -> Table:
        """The rendered text of ``columns``."""
        return self.adapter.to_table(self.data, columns)

    def same_library(self, other: Frame) -> bool:
        """Whether ``other`` comes from the same frame library."""
        return type(self.adapter) is type(other.adapter)

    def build(self, output: Output) -> Any:
        """The caller's frame for ``output`` (lazy again when the caller's was)."""
        a = self.adapter
        frame = self.data
        if output.rows is not None:
            frame = a.take(frame, output.rows)
        right = output.right
        if right is not None:
            other = a.rename(right.frame.adapter.take(right.frame.data, right.rows), right.rename)
            frame = a.hconcat(frame, other)
        for column in output.columns:
            frame = a.with_column(frame, column.name, column.values, column.dtype)
        if output.keep is not None:
            # After the new columns: a Polars frame selected down to no columns has no rows.
            frame = a.select(frame, [*output.keep, *(c.name for c in output.columns)])
        if output.fresh_labels:
            frame = a.reset_labels(frame)
        return frame.lazy() if self.lazy else frame
