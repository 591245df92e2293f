"""The persistent result cache: never pay twice for the same deterministic answer.

- :mod:`~semframe.cache.keys`: what an answer's key covers;
- :mod:`~semframe.cache.store`: the SQLite store (:class:`ResultCache`);
- :mod:`~semframe.cache.salvage`: what can be read from a damaged file;
- :mod:`~semframe.cache.serve`: serving a plan's stored answers.
"""

from semframe.cache.keys import cacheable, call_key, plan_keys, request_key, request_keys
from semframe.cache.serve import Served, serve_stored
from semframe.cache.store import FILENAME, CacheInfo, Entry, Recovery, ResultCache, open_cache

__all__ = [
    "FILENAME",
    "CacheInfo",
    "Entry",
    "Recovery",
    "ResultCache",
    "Served",
    "cacheable",
    "call_key",
    "open_cache",
    "plan_keys",
    "request_key",
    "request_keys",
    "serve_stored",
]
