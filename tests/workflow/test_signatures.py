"""Snakemake's lookups of a callable's parameters, once per function (emb.workflow.signatures):
the same answers as ``inspect.signature``, asked once per function, its override first, and
the lookup Snakemake's modules hold once the workflow has parsed."""

from __future__ import annotations

import functools
import gc
import importlib
import inspect

import pytest

from emb.workflow import signatures
from emb.workflow.signatures import MODULES, function_params, remember_signatures


class Holder:
    def method(self, wildcards, input, attempt=1):
        return attempt


def plain(wildcards, threads, resources):
    return threads


def keyword(wildcards, **aux):
    return aux


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The callables inspect.signature is asked about, in order."""
    calls: list[object] = []
    real = inspect.signature

    def counting(func, *args, **kwargs):
        calls.append(func)
        return real(func, *args, **kwargs)

    monkeypatch.setattr(signatures.inspect, "signature", counting)
    return calls


@pytest.mark.parametrize(
    "func",
    [plain, keyword, lambda wildcards: 1, Holder().method, functools.partial(plain, threads=2),
     functools.wraps(plain)(lambda *a, **k: plain(*a, **k))],
    ids=["function", "var-keyword", "lambda", "bound", "partial", "wrapped"],
)  # fmt: skip
def test_the_parameters_are_inspect_signatures(func) -> None:
    assert function_params(func) == inspect.signature(func).parameters
    assert function_params(func) == inspect.signature(func).parameters  # remembered: the same


def test_a_function_is_inspected_once_and_each_binding_of_a_method_shares_it(
    asked: list[object],
) -> None:
    def func(wildcards, input):  # made here: no other test has had it looked up
        return input

    class Local(Holder):
        def method(self, wildcards, input, attempt=1):
            return attempt

    for _ in range(3):
        function_params(func)
        function_params(Local().method)  # a new bound method, and instance, each time
    assert asked.count(func) == 1
    assert sum(getattr(f, "__func__", None) is Local.method for f in asked) == 1
    assert list(function_params(Local().method)) == ["wildcards", "input", "attempt"]  # no self
    assert list(function_params(Local.method)) == ["self", "wildcards", "input", "attempt"]
    assert list(function_params(Local().method)) == ["wildcards", "input", "attempt"]


def test_a_partial_is_inspected_each_time(asked: list[object]) -> None:
    """Its parameters depend on its arguments, not on its function: never remembered."""
    bound = functools.partial(plain, threads=2)
    function_params(bound)
    function_params(bound)
    assert asked == [bound, bound]


def test_snakemakes_override_comes_first(asked: list[object]) -> None:
    def func(*args):
        return args

    function_params(func)
    func._overwrite_params = {"wildcards": None}  # as snakemake.common.overwrite_function_params
    assert function_params(func) == {"wildcards": None}


def test_a_closure_made_per_job_is_forgotten_with_it() -> None:
    before = len(signatures._plain)
    made = [(lambda n: lambda wildcards: n)(i) for i in range(50)]
    for func in made:
        function_params(func)
    assert len(signatures._plain) >= before + 50
    del made, func
    gc.collect()
    assert len(signatures._plain) <= before


def test_snakemakes_modules_look_up_through_it_once_remembered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    modules = [importlib.import_module(name) for name in MODULES]
    for module in modules:  # put back after the test
        monkeypatch.setattr(module, "get_function_params", module.get_function_params)

    # where this Snakemake holds it by name and calls it per job (input functions, params,
    # resources); its ioutils helpers call it once per helper made
    assert remember_signatures() == ["snakemake.common", "snakemake.rules", "snakemake.jobs"]

    assert all(module.get_function_params is function_params for module in modules)
    common = modules[0]
    aux = {"input": 1, "threads": 2, "attempt": 3}
    assert common.get_input_function_aux_params(plain, aux) == {"threads": 2}
    assert common.get_input_function_aux_params(keyword, aux) == aux
