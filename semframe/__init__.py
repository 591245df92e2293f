"""semframe: LLMs inside pandas and Polars DataFrames, reordered for prefix caches.

``import semframe`` registers the ``llm`` namespace on ``pandas.DataFrame``,
``polars.DataFrame`` and ``polars.LazyFrame`` (for the libraries that are
installed; subclasses inherit it). Nothing else happens at import: no engine
starts, no file is read. Where another package already owns ``df.llm``,
semframe leaves it alone, says so with a warning, and :func:`llm` gives its
namespace for any frame either way.

Examples
--------
>>> import pandas as pd, semframe
>>> df = pd.DataFrame({"review": ["great", "dull"]})
>>> df.llm.filter("Is {review} positive?", backend="fake")
  review
0  great
>>> semframe.llm(df).map("Echo {review}", backend="fake").llm_output.tolist()
['fake: great', 'fake: dull']
"""

from __future__ import annotations

import warnings
from typing import Any

from semframe import ray as ray  # semframe.ray.map(ds, ...): Ray Data (imports no Ray)
from semframe._version import __version__
from semframe.accessor import LLMAccessor
from semframe.backends import describe
from semframe.config import ResolvedConfig, configure, using
from semframe.config import config as _resolve
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
from semframe.operators.registry import register_operator
from semframe.runtime.calibrate import calibrate_local
from semframe.runtime.stats import OpStats, RunStats, last_op, last_run

__all__ = [
    "BudgetExceeded",
    "ColumnError",
    "ConfigError",
    "Estimate",
    "InputError",
    "LLMAccessor",
    "OpStats",
    "Ordering",
    "Plan",
    "RelQuery",
    "RowError",
    "RowErrors",
    "RunStats",
    "SemframeError",
    "SemframeWarning",
    "TemplateError",
    "__version__",
    "calibrate_local",
    "config",
    "configure",
    "last_op",
    "last_run",
    "llm",
    "register_operator",
    "using",
]


def config(**overrides: Any) -> ResolvedConfig:
    """Every setting resolved, where each came from, and what a run would use.

    :func:`semframe.config.config`, with the model the backend runs named
    where ``model`` is not set: ``print(semframe.config())`` lists each
    setting's value (a ``None`` default replaced by what it stands for where
    that is known: the backend's model, the cache folder's path) and its
    source (``default``, the ``semframe.toml`` or ``pyproject.toml`` path,
    ``SEMFRAME_<NAME>``, ``semframe.configure()``, ``semframe.using()``, or
    ``call argument``).

    Examples
    --------
    >>> import semframe
    >>> cfg = semframe.config(backend="openai")
    >>> cfg["model"], cfg.effective["model"]
    (None, 'gpt-4.1-mini')
    >>> print(cfg)  # doctest: +ELLIPSIS
    semframe config
    backend ... = 'openai' ... # call argument
    model   ... = 'gpt-4.1-mini' ... # default: the 'openai' backend's model
    ...
    """
    return describe(_resolve(**overrides))


class SemframeWarning(UserWarning):
    """Something semframe did differently from what was asked, and why."""


def llm(frame: Any) -> LLMAccessor:
    """The ``df.llm`` namespace of ``frame``, whoever owns the ``llm`` attribute.

    Examples
    --------
    >>> import polars as pl, semframe
    >>> semframe.llm(pl.DataFrame({"t": ["a"]})).map("Echo {t}", backend="fake").shape
    (1, 2)
    """
    return LLMAccessor(frame)


def _owner(cls: type) -> str | None:
    """Who defines ``cls.llm`` when it is not semframe (``None``: nobody, or semframe).

    pandas and Polars both give the namespace class when the attribute is read
    from the frame class itself.
    """
    found = getattr(cls, "llm", None)
    if found is None or found is LLMAccessor:
        return None
    kind = found if isinstance(found, type) else type(found)
    return f"{kind.__module__}.{kind.__qualname__}"


def _register() -> None:
    """Register ``llm`` on the frame libraries that are installed; never over another's."""
    targets: list[tuple[type, Any]] = []
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - pandas is optional
        pass
    else:
        targets.append((pd.DataFrame, pd.api.extensions.register_dataframe_accessor("llm")))
    try:
        import polars as pl
    except ImportError:  # pragma: no cover - polars is optional
        pass
    else:
        targets.append((pl.DataFrame, pl.api.register_dataframe_namespace("llm")))
        targets.append((pl.LazyFrame, pl.api.register_lazyframe_namespace("llm")))
    for cls, register in targets:
        if not hasattr(cls, "llm"):
            register(LLMAccessor)
            continue
        owner = _owner(cls)
        if owner is not None:
            msg = (
                f"{cls.__module__}.{cls.__qualname__}.llm already belongs to {owner}; semframe "
                f"left it in place. Use semframe.llm(df).map(...) (works either way), or "
                f"remove the other namespace before importing semframe."
            )
            warnings.warn(msg, SemframeWarning, stacklevel=3)


_register()
