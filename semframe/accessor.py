"""The ``df.llm`` namespace: identical on pandas and Polars, stateless, thin.

pandas rebuilds an accessor on every attribute access and Polars caches it on
the frame, so the accessor holds nothing but the frame and delegates every call
to :mod:`semframe.ops`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semframe import ops
from semframe.plan import Plan


class LLMAccessor:
    """LLM operators over the rows of a frame: ``df.llm.map``, ``df.llm.filter``, ...

    Every operator accepts these settings as keyword arguments, overriding
    ``semframe.using``/``configure``/environment/file settings for this call:
    ``backend``, ``model``, ``reorder``, ``max_concurrency``, ``temperature``,
    ``max_retries``, ``errors``, ``progress`` (see
    ``semframe.config()``). Run statistics of the last call are in
    ``semframe.last_run()``.
    """

    def __init__(self, frame: Any) -> None:
        self._frame = frame

    def map(
        self,
        template: str,
        *,
        out: str = "llm_output",
        max_tokens: int | None = None,
        system: str | None = None,
        examples: Sequence[Mapping[str, object]] | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """Ask ``template`` of every row; return a new frame with the answers in ``out``.

        Parameters
        ----------
        template : str
            Instruction with ``{column}`` placeholders (``{{``/``}}`` for braces).
            Only the named columns are sent.
        out : str
            Name of the new column (must not exist yet).
        max_tokens : int, optional
            Output limit per row (default 256).
        system : str, optional
            System message shared by all rows.
        examples : sequence of mapping, optional
            Few-shot examples: each maps every template column and ``"answer"``.
        truncate : int or mapping, optional
            Cut cells to this many characters (per column with a mapping).
        backend, model : str, optional
            Where to run (default from configuration: the local engine).
        **settings
            Any other setting (``reorder="ggr"``, ``max_concurrency=4``, ...).

        Returns
        -------
        DataFrame
            Same type, rows, order and index as the input, plus ``out``.

        Raises
        ------
        RowErrors
            When rows fail after retries (with ``errors="raise"``, the
            default); ``.result`` holds the frame with the successful answers.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"title": ["Alien", "Heat"], "year": [1979, 1995]},
        ...                   index=["a", "b"])
        >>> df.llm.map("Describe {title} ({year}).", out="blurb", backend="fake")
           title  year               blurb
        a  Alien  1979  fake: Alien | 1979
        b   Heat  1995   fake: Heat | 1995
        """
        return ops.llm_map(
            self._frame,
            template,
            out=out,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def filter(
        self,
        template: str,
        *,
        max_tokens: int | None = None,
        system: str | None = None,
        examples: Sequence[Mapping[str, object]] | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """Keep the rows for which the model answers yes to ``template``.

        The answer is constrained to ``{"answer": "yes"|"no"}`` on backends that
        support JSON schemas, and parsed strictly everywhere: an answer that is
        neither yes nor no is retried, then reported as a row error, never
        taken as a default.

        Parameters
        ----------
        template : str
            A yes/no question with ``{column}`` placeholders.
        max_tokens, system, examples, truncate, backend, model, **settings
            As for :meth:`map` (``examples`` answers are ``"yes"``/``"no"``).

        Returns
        -------
        DataFrame
            The matching rows, in the input order with their index. With
            ``errors="keep"``, rows that failed are kept too and an
            ``llm_error`` column says why.

        Examples
        --------
        >>> import polars as pl, semframe
        >>> df = pl.DataFrame({"review": ["a great film", "dull", "I loved it"]})
        >>> df.llm.filter("Is {review} positive?", backend="fake")
        shape: (2, 1)
        ┌──────────────┐
        │ review       │
        │ ---          │
        │ str          │
        ╞══════════════╡
        │ a great film │
        │ I loved it   │
        └──────────────┘
        """
        return ops.llm_filter(
            self._frame,
            template,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def plan(self, template: str, *, op: str = "map", **kwargs: Any) -> Plan:
        """The :class:`~semframe.plan.Plan` of an operator call, without running it.

        Parameters
        ----------
        template : str
            As for the operator.
        op : {"map", "filter"}
            Which operator to plan.
        **kwargs
            The operator's other arguments.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"movie": ["Up", "Up", "Heat"], "review": ["fun", "sweet", "long"]})
        >>> plan = df.llm.plan("Is {review} of {movie} positive?", op="filter", reorder="stats")
        >>> len(plan.requests), len(plan.groups), plan.ordering.fields[0]
        (3, 2, ('movie', 'review'))
        """
        return ops.llm_plan(self._frame, template, op=op, **kwargs)
