"""Snakemake asks ``inspect.signature`` which arguments each input function, params function
and resource callable takes every time it calls one: twice per callable per job, and once more
for the bound ``Resource.evaluate`` around each resource. For 1,000 regions x 4 runs that is
110,000 signatures (~9% of a cluster dry run, issue 58). A function's parameters do not change
once it exists, so :func:`remember_signatures` has Snakemake look each one up once.

Only plain functions and methods bound to one are remembered, keyed by the function itself
(held weakly: a closure made per job is forgotten with it); any other callable (a partial, an
object with ``__call__``) is asked each time as before. Snakemake's own override
(``overwrite_function_params``, an attribute on the function) still comes first.
"""

from __future__ import annotations

import inspect
import types
import weakref
from collections.abc import Callable, Mapping
from typing import Any

MODULES = ("snakemake.common", "snakemake.rules", "snakemake.jobs")  # hold it by name
OVERRIDE = "_overwrite_params"  # snakemake.common.FUNC_OVERWRITE_PARAMS_ATTR

_plain: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def function_params(func: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    """What ``snakemake.common.get_function_params`` returns, each function's looked up once."""
    if hasattr(func, OVERRIDE):
        return getattr(func, OVERRIDE)
    if isinstance(func, types.FunctionType):
        cache, key = _plain, func
    elif isinstance(func, types.MethodType) and isinstance(func.__func__, types.FunctionType):
        cache, key = _bound, func.__func__  # any instance: its first parameter is dropped
    else:
        return inspect.signature(func).parameters
    params = cache.get(key)
    if params is None:
        params = cache[key] = inspect.signature(func).parameters
    return params


def remember_signatures() -> list[str]:
    """Make :func:`function_params` Snakemake's lookup wherever it is held by name; the
    modules it was made in (one that does not hold it, in another Snakemake, keeps its own)."""
    import importlib

    patched = []
    for name in MODULES:
        module = importlib.import_module(name)
        if callable(getattr(module, "get_function_params", None)):
            module.get_function_params = function_params
            patched.append(name)
    return patched
