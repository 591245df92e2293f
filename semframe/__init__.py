"""semframe: LLMs inside pandas and Polars DataFrames, reordered for prefix caches.

``import semframe`` registers the ``llm`` namespace on ``pandas.DataFrame``,
``polars.DataFrame`` and ``polars.LazyFrame`` (for the libraries that are
installed). Nothing else happens at import: no engine starts, no file is read.

Examples
--------
>>> import pandas as pd, semframe
>>> df = pd.DataFrame({"review": ["great", "dull"]})
>>> df.llm.filter("Is {review} positive?", backend="fake")
  review
0  great
"""

from __future__ import annotations

from semframe.accessor import LLMAccessor
from semframe.config import config, configure, using
from semframe.core.ordering import Ordering
from semframe.core.plan import Plan, RelQuery
from semframe.cost.estimate import Estimate
from semframe.errors import (
    BudgetExceeded,
    ColumnError,
    ConfigError,
    InputError,
    RowError,
    RowErrors,
    SemframeError,
    TemplateError,
)
from semframe.runtime.execute import RunStats, last_run

__all__ = [
    "BudgetExceeded",
    "ColumnError",
    "ConfigError",
    "Estimate",
    "InputError",
    "LLMAccessor",
    "Ordering",
    "Plan",
    "RelQuery",
    "RowError",
    "RowErrors",
    "RunStats",
    "SemframeError",
    "TemplateError",
    "__version__",
    "config",
    "configure",
    "last_run",
    "using",
]

__version__ = "0.1.0"


def _register() -> None:
    """Register ``llm`` on the frame libraries that are installed."""
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is optional
        pass
    else:
        if not hasattr(pd.DataFrame, "llm"):
            pd.api.extensions.register_dataframe_accessor("llm")(LLMAccessor)
    try:
        import polars as pl
    except ImportError:  # pragma: no cover - polars is optional
        pass
    else:
        if not hasattr(pl.DataFrame, "llm"):
            pl.api.register_dataframe_namespace("llm")(LLMAccessor)
        if not hasattr(pl.LazyFrame, "llm"):
            pl.api.register_lazyframe_namespace("llm")(LLMAccessor)


_register()
