"""Ray Data in and out: the row-by-row operators over a ``ray.data.Dataset``.

``semframe.ray.map(ds, template, ...)``, :func:`filter`, :func:`extract` and
:func:`classify` take a ``ray.data.Dataset`` and the keyword arguments of the
DataFrame operators (``out=``, ``backend=``, ``model=``, ``replicas=``,
``max_tokens=``, ``errors=``...), and return a ``ray.data.Dataset``: every
input column plus the answer column(s), in the input's row order (``filter``:
the kept rows). The relQuery runs through ``executor="ray"``
(:mod:`semframe.runtime.ray_executor`): partitioning, faults, the result cache
and ``semframe.last_run()`` are those of a DataFrame call.

How it runs:

1. Bad input fails first, before the Dataset is read: the operator compiles
   on an empty frame of the Dataset's schema (a template naming a missing
   column, an ``out=`` column that exists, a bad setting such as
   ``replicas=0``), the backend is built (a missing API key) and the Ray
   cluster is checked for the replicas' CPUs and GPUs, with one CPU left
   beside them for Ray Data's own tasks.
2. A unique row id (Ray Data's ``monotonically_increasing_id``) is added and
   the Dataset is materialized once, in the cluster's object store (its
   blocks stay there; Ray spills them to disk when they do not fit), with
   ``preserve_order`` on: the blocks are in the order of the source.
3. Only the template's columns and the row id come to the driver
   (``select_columns``): the driver plans them as a DataFrame call would
   (GGR over the whole relQuery), and the Ray replicas answer them.
4. The answers (row id, new columns) become one Arrow table, put in the
   object store once; a Ray Data task per materialized block looks its rows
   up in it by id and appends the new columns (a broadcast join: no shuffle,
   the block order kept; ``filter`` drops the rows it does not keep there).
   The other columns never pass through the driver. A row whose id has no
   answer fails the task rather than getting another row's answer.

The result is lazy on the Ray Data side (the lookup runs when it is consumed;
it keeps ``preserve_order`` on, so its order holds through later steps too)
and the relQuery has run when the call returns. ``RowErrors`` and
``BudgetExceeded`` carry their partial result as such a Dataset;
``estimate=True`` returns the :class:`~semframe.cost.estimate.Estimate`.

Why not ``Dataset.zip`` with ``ray.data.range`` positions: Ray 2.60
deprecates ``zip`` (it relies on an order Ray Data does not guarantee by
default; removed in 2.64). A ``join`` on the row id would shuffle every
column twice (the join, then a sort to restore the order); the answers are
small beside the rows and already on the driver, so they are broadcast.

Not done yet: the template's columns (the long unique text included) still
come to the driver, which plans the whole relQuery in its memory.

Ray is imported on first use; ``import semframe`` does not import it
(``pip install "semframe[ray]"``).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from semframe.backends import get_backend
from semframe.config import SETTINGS, config
from semframe.core.frames import Frame
from semframe.core.template import compile_template
from semframe.errors import (
    BudgetExceeded,
    ConfigError,
    InputError,
    MissingDependencyError,
    RowErrors,
    SemframeError,
)
from semframe.operators.cascade import CascadeOperator
from semframe.operators.lazy import ProbeRunner
from semframe.operators.registry import Operator, get_operator, invoke, pop_run_options
from semframe.runtime.ray_executor import INSTALL_LINE, connect, release_other_replicas

if TYPE_CHECKING:
    from ray.data import Dataset

__all__ = ["OPERATORS", "ROW_ID", "classify", "extract", "filter", "map", "require_ray_data"]

OPERATORS = ("map", "filter", "extract", "classify")
"""The operators that take a ``ray.data.Dataset``."""

ROW_ID = "__semframe_row__"
"""The row-id column added to the input while it runs (a reserved name)."""

_KEEP = "__semframe_keep__"
_RESERVED = (ROW_ID, _KEEP)

_ARROW_TYPES = ("str", "bool", "int", "float", "list[str]")


def require_ray_data() -> Any:
    """Import Ray with Ray Data, or fail with the install line; returns ``ray``.

    Raises
    ------
    MissingDependencyError
        When Ray (or what Ray Data needs: pandas, pyarrow) is not installed.
    """
    try:
        importlib.import_module("ray.data")
    except ImportError as exc:
        msg = (
            f"semframe.ray needs Ray Data, which does not import here ({exc}). "
            f"Install it with: {INSTALL_LINE}"
        )
        raise MissingDependencyError(msg) from None
    return importlib.import_module("ray")


def map(
    ds: Dataset,
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
    """Ask ``template`` of every row of ``ds``; a Dataset with the answers in ``out``.

    Parameters
    ----------
    ds : ray.data.Dataset
        The rows. Only the columns ``template`` names come to the driver.
    template : str
        Instruction with ``{column}`` placeholders, as for ``df.llm.map``.
    out : str
        Name of the new column (must not exist yet).
    language, max_tokens, system, examples, truncate, backend, model
        As for ``df.llm.map``.
    **settings
        Any other setting (``replicas=4``, ``ray_num_cpus=1``, ``errors="keep"``,
        ``cache=False``...), and ``estimate=``, ``budget=``, ``probe=``.
        ``executor`` is ``"ray"`` (another value is a ``ConfigError``).

    Returns
    -------
    ray.data.Dataset
        Every column of ``ds`` and ``out`` (Arrow ``string``), in the order of
        ``ds``. With ``estimate=True``, the
        :class:`~semframe.cost.estimate.Estimate` instead.

    Raises
    ------
    InputError, ColumnError, ConfigError
        Before anything is read or sent: ``ds`` is not a Dataset, the template
        names a column it lacks, a setting is invalid (``replicas=0``).
    RowErrors
        When rows fail (``errors="raise"``, the default); ``.result`` is the
        Dataset with the successful answers.
    MissingDependencyError
        When Ray Data is not installed.

    Examples
    --------
    On a Ray cluster (the one ``ray.init()`` joined, or a local one started on
    first use; ``docs/ray.md`` has a longer example, run by the tests)::

        import ray, semframe

        ds = ray.data.from_items([{"title": "Alien"}, {"title": "Heat"}])
        out = semframe.ray.map(ds, "Describe {title}.", backend="fake", ray_num_cpus=0.5)
        out.take_all()
        # [{'title': 'Alien', 'llm_output': 'fake: Alien'},
        #  {'title': 'Heat', 'llm_output': 'fake: Heat'}]
    """
    return _run(
        "map",
        ds,
        template,
        {
            "out": out,
            "language": language,
            "max_tokens": max_tokens,
            "system": system,
            "examples": examples,
            "truncate": truncate,
            "backend": backend,
            "model": model,
            **settings,
        },
    )


def filter(
    ds: Dataset,
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
    """The rows of ``ds`` for which the model answers yes to ``template``.

    Parameters
    ----------
    ds : ray.data.Dataset
        The rows. Only the columns ``template`` names come to the driver.
    template : str
        A yes/no question with ``{column}`` placeholders.
    calibrate, max_tokens, system, examples, truncate, backend, model, **settings
        As for ``df.llm.filter`` and :func:`map`.

    Returns
    -------
    ray.data.Dataset
        The kept rows with every column of ``ds``, in the order of ``ds``.
        With ``errors="keep"``, failed rows are kept too and ``llm_error``
        says why.

    Raises
    ------
    InputError, ColumnError, ConfigError, RowErrors, MissingDependencyError
        As for :func:`map`.
    """
    return _run(
        "filter",
        ds,
        template,
        {
            "calibrate": calibrate,
            "max_tokens": max_tokens,
            "system": system,
            "examples": examples,
            "truncate": truncate,
            "backend": backend,
            "model": model,
            **settings,
        },
    )


def extract(
    ds: Dataset,
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
    """Typed fields of every row of ``ds``, one new column each.

    Parameters
    ----------
    ds : ray.data.Dataset
        The rows. Only the columns ``template`` names come to the driver.
    template : str
        What to extract, with ``{column}`` placeholders.
    schema : mapping or pydantic model class
        New column name -> type, as for ``df.llm.extract``.
    max_tokens, system, examples, truncate, backend, model, **settings
        As for :func:`map`.

    Returns
    -------
    ray.data.Dataset
        Every column of ``ds`` plus one per schema field, typed ``string``,
        ``bool``, ``int64``, ``double`` or ``list<string>``; failed rows hold
        nulls (with ``errors="keep"`` an ``llm_error`` column says why).

    Raises
    ------
    InputError, ColumnError, ConfigError, RowErrors, MissingDependencyError
        As for :func:`map`.
    """
    return _run(
        "extract",
        ds,
        template,
        {
            "schema": schema,
            "max_tokens": max_tokens,
            "system": system,
            "examples": examples,
            "truncate": truncate,
            "backend": backend,
            "model": model,
            **settings,
        },
    )


def classify(
    ds: Dataset,
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
    """Label every row of ``ds`` with one of ``labels`` (several with ``multi=True``).

    Parameters
    ----------
    ds : ray.data.Dataset
        The rows. Only the columns ``template`` names come to the driver.
    template : str
        What to classify, with ``{column}`` placeholders.
    labels : sequence of str
        The valid labels, as for ``df.llm.classify``.
    out, multi, calibrate, max_tokens, system, examples, truncate, backend, model, **settings
        As for ``df.llm.classify`` and :func:`map`.

    Returns
    -------
    ray.data.Dataset
        Every column of ``ds`` plus ``out`` (``string``, or ``list<string>``
        with ``multi``), in the order of ``ds``.

    Raises
    ------
    InputError, ColumnError, ConfigError, RowErrors, MissingDependencyError
        As for :func:`map`.
    """
    return _run(
        "classify",
        ds,
        template,
        {
            "labels": labels,
            "out": out,
            "multi": multi,
            "calibrate": calibrate,
            "max_tokens": max_tokens,
            "system": system,
            "examples": examples,
            "truncate": truncate,
            "backend": backend,
            "model": model,
            **settings,
        },
    )


def _run(name: str, ds: Any, template: str, arguments: dict[str, Any]) -> Any:
    """Check the call, run it on the template's columns, put the answers back in the blocks."""
    ray = require_ray_data()
    if not isinstance(ds, ray.data.Dataset):
        msg = (
            f"semframe.ray.{name} takes a ray.data.Dataset, got {type(ds).__name__}. "
            f"For a pandas or Polars frame use df.llm.{name}(...), with executor='ray' to "
            "run on Ray replicas."
        )
        raise InputError(msg)
    executor = arguments.pop("executor", None)
    if executor is not None and str(executor).strip().lower() != "ray":
        msg = (
            f"semframe.ray.{name} runs with executor='ray'; got executor={executor!r}. Leave "
            f"it out, or call df.llm.{name} on a DataFrame for executor='local'."
        )
        raise ConfigError(msg)
    arguments["executor"] = "ray"
    columns = [str(c) for c in (ds.columns() or [])]
    taken = [c for c in _RESERVED if c in columns]
    if taken:
        msg = f"the Dataset has column(s) {taken}, which semframe.ray uses; rename them first."
        raise InputError(msg)
    hints = _check(name, columns, template, arguments)
    fields = list(compile_template(template, columns).fields)

    mat = _materialize(ds)
    ids, frame = _read_fields(mat, fields)
    where = {
        "source": ds,
        "ids": ids,
        "frame": frame,
        "columns": columns,
        "hints": hints,
        "name": name,
    }
    try:
        result = invoke(name, frame, template, **arguments)
    except (RowErrors, BudgetExceeded) as exc:
        if _is_frame(exc.result):
            exc.result = _attach_answers(ray, mat, exc.result, **where)
        raise
    if not _is_frame(result):  # estimate=True / dry_run=True: the Estimate
        return result
    return _attach_answers(ray, mat, result, **where)


def _check(
    name: str, columns: Sequence[str], template: str, arguments: dict[str, Any]
) -> dict[str, str]:
    """Everything that needs no data: the operator compiles on an empty frame of ``columns``.

    Returns the dtype of each column the operator adds (``str``, ``int``...),
    from a run of the operator on that empty frame (nothing is sent).

    Raises
    ------
    SemframeError
        What the operator raises for this call before sending anything, a
        backend that cannot be built, a Ray cluster without room for the replicas.
    """
    import pandas as pd

    given = dict(arguments)
    pop_run_options(given)
    op: Operator = get_operator(name)
    if given.get("cascade") is not None:
        op = CascadeOperator(op)
    else:
        given.pop("cascade", None)
    empty = pd.DataFrame({c: pd.Series([], dtype=object) for c in columns})
    edge = Frame.of(empty)
    compiled = op.compile(edge, template, **given)
    output = op.run(compiled, ProbeRunner(op.name))
    settings = config(**{k: v for k, v in given.items() if k in SETTINGS})
    _check_room(connect(settings), settings)
    if given.get("cascade") is None:
        backend = get_backend(settings["backend"], model=settings["model"], settings=settings)
        # Replicas of other settings, kept from an earlier call, would hold CPUs that
        # Ray Data needs to read the Dataset; this call's run would replace them anyway.
        release_other_replicas(settings, backend)
    return {c.name: c.dtype for c in output.columns}


def _check_room(ray: Any, settings: Mapping[str, Any]) -> None:
    """Fail unless the replicas leave a CPU of the cluster to Ray Data's own tasks.

    Reading the Dataset and joining the answers back are Ray Data tasks of one
    CPU each; with every CPU held by replicas (kept for later calls) they
    would wait forever.

    Raises
    ------
    ConfigError
        Naming the CPUs the replicas hold and the cluster's.
    """
    total = sum(
        float(node.get("Resources", {}).get("CPU", 0.0))
        for node in ray.nodes()
        if node.get("Alive")
    )
    held = settings["replicas"] * float(settings["ray_num_cpus"])
    if total - held < 1:
        msg = (
            f"replicas={settings['replicas']} x ray_num_cpus={float(settings['ray_num_cpus']):g} "
            f"hold {held:g} of the Ray cluster's {total:g} CPU(s), but semframe.ray needs one "
            "left for Ray Data's tasks (reading the Dataset, joining the answers back), which "
            "would wait forever; nothing was read or sent. Lower replicas or ray_num_cpus (a "
            "replica calling an API needs little CPU: ray_num_cpus=0.25), or add a node."
        )
        raise ConfigError(msg)


def _materialize(ds: Any) -> Any:
    """``ds`` with a unique row id (:data:`ROW_ID`), materialized in source order.

    The ids are Ray Data's ``monotonically_increasing_id`` (unique, not
    consecutive). ``preserve_order`` is set on ``ds``'s context while it
    runs (and restored): the materialized Dataset keeps a copy of it, so its
    blocks are in the order of the source, and so is everything made from it
    (the result included).
    """
    from ray.data.expressions import monotonically_increasing_id

    options = ds.context.execution_options
    before = options.preserve_order
    options.preserve_order = True
    try:
        # Arrow blocks first: on a pandas block whose index does not start at 0 (a
        # slice given to from_pandas), Ray 2.60 aligns the ids on that index and
        # leaves most of them null (Dataset.zip does the same).
        arrow = ds.map_batches(
            _as_arrow, batch_format="pyarrow", batch_size=None, zero_copy_batch=True
        )
        return arrow.with_column(ROW_ID, monotonically_increasing_id()).materialize()
    finally:
        options.preserve_order = before


def _as_arrow(batch: Any) -> Any:
    """A block as Ray Data hands it over in Arrow form (the identity)."""
    return batch


def _read_fields(mat: Any, fields: Sequence[str]) -> tuple[Any, Any]:
    """The row ids and the template's columns of ``mat``, on the driver, in ``mat``'s order.

    Only ``fields`` and the id leave the cluster. Returns the ids (a numpy
    array) and a pandas frame of ``fields`` labeled by position.

    Raises
    ------
    SemframeError
        When a row has no id or two rows share one (nothing is sent).
    """
    import numpy as np
    import pandas as pd

    if mat.count() == 0:
        empty = pd.DataFrame({f: pd.Series([], dtype=object) for f in fields})
        return np.zeros(0, dtype=np.int64), empty
    read = mat.select_columns([ROW_ID, *fields]).to_pandas()
    column = read[ROW_ID]
    ids = column.to_numpy(dtype=np.int64) if not column.isna().any() else None
    if ids is None or len(np.unique(ids)) != len(ids):
        msg = (
            "internal error: the rows of the Dataset did not get a unique row id each; "
            "nothing was sent."
        )
        raise SemframeError(msg)
    return ids, read.drop(columns=[ROW_ID]).reset_index(drop=True)


def _is_frame(value: object) -> bool:
    """Whether ``value`` is a pandas frame (an operator's result here, not an estimate)."""
    import pandas as pd

    return isinstance(value, pd.DataFrame)


def _attach_answers(
    ray: Any,
    mat: Any,
    result: Any,
    *,
    source: Any,
    ids: Any,
    frame: Any,
    columns: Sequence[str],
    hints: Mapping[str, str],
    name: str,
) -> Any:
    """``mat`` with the new columns of ``result`` (labeled by position), as a Dataset.

    ``source`` is the caller's Dataset (its schema types an empty result).

    The answers become one Arrow table on the driver, sorted by row id (the
    id, whether ``filter`` keeps the row, the new columns) and put in the
    object store once; a task per block of ``mat`` looks its rows up in it
    (:func:`_attach`). The blocks' other columns stay where they are, and
    their order is kept.
    """
    import numpy as np
    import pyarrow as pa  # type: ignore[import-untyped]

    n = len(frame)
    new = [str(c) for c in result.columns if str(c) not in frame.columns]
    # A column the result adds only where the input lacks it (``llm_error`` on a
    # RowErrors result): the Dataset has it, so it is not added again.
    new = [c for c in new if c not in columns]
    full = result.reindex(range(n))
    order = np.argsort(ids, kind="stable")
    arrays: dict[str, Any] = {ROW_ID: pa.array(ids[order], type=pa.int64())}
    filtered = name == "filter"
    if filtered:
        keep = np.zeros(n, dtype=bool)
        keep[result.index.to_numpy(dtype=np.int64)] = True
        arrays[_KEEP] = pa.array(keep[order], type=pa.bool_())
    for c in new:
        arrays[c] = _arrow(full[c], hints.get(c)).take(pa.array(order))
    if not n:  # no block to look up: the input's schema and the new columns
        known = source.schema()
        given = zip(known.names, known.types, strict=True) if known is not None else ()
        fields = [pa.field(c, t if isinstance(t, pa.DataType) else pa.string()) for c, t in given]
        fields += [pa.field(c, arrays[c].type) for c in new]
        return ray.data.from_arrow(pa.schema(fields).empty_table())
    answers = ray.put(pa.table(arrays))
    return mat.map_batches(
        _attach,
        fn_kwargs={"answers": answers, "columns": new, "filtered": filtered},
        batch_format="pyarrow",
        batch_size=None,
        zero_copy_batch=True,
    )


def _arrow(series: Any, dtype: str | None) -> Any:
    """A pandas column of an operator's result as an Arrow array (missing values null)."""
    import pyarrow as pa

    values = series.astype(object).where(series.notna(), None).tolist()
    types = {
        "str": pa.string(),
        "bool": pa.bool_(),
        "int": pa.int64(),
        "float": pa.float64(),
        "list[str]": pa.list_(pa.string()),
    }
    kind = types.get(dtype) if dtype in _ARROW_TYPES else None
    if kind is not None:
        return pa.array(values, type=kind)
    array = pa.array(values)
    return array.cast(pa.string()) if pa.types.is_null(array.type) else array


def _attach(batch: Any, *, answers: Any, columns: Sequence[str], filtered: bool) -> Any:
    """One block of the input with its answers: looked up by row id, in the block's order.

    ``answers`` is the object-store reference of the answers table (sorted by
    :data:`ROW_ID`); ``filter`` drops the rows it does not keep.

    Raises
    ------
    SemframeError
        When a row's id has no answer (the block is not one of the call's).
    """
    import numpy as np
    import pyarrow as pa

    ray = require_ray_data()
    table = ray.get(answers)
    known = table[ROW_ID].to_numpy()
    wanted = batch[ROW_ID].to_numpy()
    at = np.searchsorted(known, wanted)
    found = at < len(known)
    if not found.all() or not np.array_equal(known[at], wanted):
        msg = "internal error: a row of the Dataset has no answer; its block was not the call's"
        raise SemframeError(msg)
    picked = table.take(pa.array(at))
    batch = batch.drop_columns([ROW_ID])
    if filtered:
        mask = picked[_KEEP]
        batch, picked = batch.filter(mask), picked.filter(mask)
    for c in columns:
        batch = batch.append_column(c, picked[c])
    return batch
