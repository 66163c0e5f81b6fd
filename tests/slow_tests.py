"""The slow tier: which tests `pytest -m "not slow"` (the edit-test loop) leaves out, and why.

A test is slow when it starts a whole workflow, SLURM, torchrun or a multi-process trial, or
takes more than ~10 s on 2 cores. `pytest` (CI) still runs everything. Three ways in:

- ``SLOW_MARKERS``: every test with one of these markers (SLURM, fault-injection trials).
- ``SLOW_FIXTURES``: every test that needs one of these fixtures, directly or through another
  fixture: the fixture itself starts the expensive thing, so a new test that uses it is slow too.
- ``SLOW_FILES``: whole test files, or tests (functions or single parameters) by file, each
  with its reason; the seconds are those of an idle 2-core machine.

Listed names are checked at collection (``check``): a renamed or deleted test or fixture fails
the run with its entry named, so this list cannot rot silently. Timings: ``--durations=0``.

``LONGEST_FIRST``: the order in which pytest-xdist's workers take the modules (``order``).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from pathlib import Path

import pytest

# every item collected, before `-m` or `-k` deselect any (for tests/test_slow_tier.py)
COLLECTED = pytest.StashKey[list[pytest.Item]]()

SLOW_MARKERS: dict[str, str] = {
    "slurm": "a real single-node SLURM and whole workflows on it",
    "reliability": "fault-injection trials: torchrun runs killed, resumed and compared",
}

# "file::fixture" -> why every test that needs it is slow
SLOW_FIXTURES: dict[str, str] = {
    "tests/test_workflow.py::finished_run": "whole Snakemake workflow on the tiny demo",
    "tests/areas/test_workflow_areas.py::finished": "whole Snakemake workflow over area zones",
    "tests/training/test_ddp.py::ranks": "torchrun, 2 ranks, one run per architecture",
    "tests/training/test_train_resume.py::reference": "torchrun, 2 ranks, an uninterrupted run",
    "tests/cluster/test_profiles.py::listed": "a Snakemake dry run per cluster profile",
    "tests/cluster/test_profiles.py::own_data": "a dry run per profile, then its jobs run",
    "tests/evaluation/test_processes.py::trained": "fits a DeepLab run for multi-process tests",
}

SNAKEMAKE = "a Snakemake run or dry run (~10-20 s each)"
TORCHRUN = "torchrun or spawned ranks (gloo)"
# file -> why the whole file is slow, or {test function or test[param]: why it is slow}
SLOW_FILES: dict[str, str | dict[str, str]] = {
    "tests/test_workflow.py": "whole Snakemake workflow runs and dry runs",
    "tests/test_workflow_inputs.py": "a whole Snakemake workflow and dry runs",
    "tests/areas/test_workflow_areas.py": "whole Snakemake workflow over area zones",
    "tests/training/test_ddp.py": TORCHRUN,
    "tests/cluster/test_torchrun_failures.py": TORCHRUN,
    "tests/workflow/test_parse_refusals.py": {
        "test_snakemake_prints_the_refusal_in_one_line": SNAKEMAKE,
        "test_a_bad_labelled_sample_is_refused_before_any_job_and_results_stay": SNAKEMAKE,
    },
    "tests/areas/test_refetch.py": "Snakemake runs over a served collection: fetch, refetch",
    "tests/prep/test_manifest_validation.py": {
        "test_snakemake_plans_the_check_and_evaluate_reads_the_manifest": SNAKEMAKE
    },
    "tests/bench/test_bench_defaults.py": {
        "test_each_bench_runs_its_default_path_in_its_smallest_mode": "each bench as a process"
    },
    "tests/bench/test_dry_run_identity.py": {
        "test_two_dry_runs_of_the_demo_compare_equal": "two Snakemake dry runs of the demo",
    },
    "tests/training/test_train_resume.py": "torchrun, 2 ranks, killed and resumed",
    "tests/training/test_resume_schedule.py": {
        "test_two_ranks_resumed_with_a_longer_run_log_a_continuous_lr": TORCHRUN,
    },
    "tests/training/test_train_runs.py": {
        "test_compile_inside_ddp_trains_and_saves_unprefixed_weights": TORCHRUN,
        "test_two_rank_validation_equals_one_rank_validation": TORCHRUN,
    },
    "tests/training/test_recipe_second_pass.py": {
        "test_train_losses_are_averaged_over_ranks": TORCHRUN,
        "test_the_workflow_warns_before_any_job": SNAKEMAKE,
    },
    "tests/cluster/test_launch.py": {
        "test_usr1_to_the_launcher_reaches_every_torchrun_worker_and_exits_75": TORCHRUN,
        "test_torchrun_survives_usr1_sent_to_every_process_as_slurm_does": TORCHRUN,
    },
    "tests/cluster/test_scale_dry_run.py": "Snakemake dry runs of a thousand regions",
    "tests/cluster/test_predict_only_dry_run.py": {
        "test_a_thousand_prediction_only_regions_add_no_slurm_job": SNAKEMAKE,
    },
    "tests/cluster/test_profiles.py": {
        "test_a_typo_in_the_cluster_overlay_stops_before_submission_naming_file_and_key":
            SNAKEMAKE,
        "test_missing_variable_stops_a_real_run_and_only_warns_in_a_dry_run": SNAKEMAKE,
        "test_missing_container_image_stops_a_real_run_only": SNAKEMAKE,
        "test_profile_asking_more_gpus_than_a_node_has_stops_before_submission": SNAKEMAKE,
    },
    "tests/cluster/test_gpu_check.py": {
        "test_the_rule_expects_the_machines_gpus_unless_a_number_is_set": SNAKEMAKE,
    },
    "tests/areas/test_bad_inputs.py": {"test_snakemake_refuses_before_any_job": SNAKEMAKE},
    "tests/areas/test_fetch.py": {"test_snakemake_fetches_then_writes_the_vrts": SNAKEMAKE},
    "tests/test_inputs.py": {
        "test_valid_external_rows_pass_validation": SNAKEMAKE,
        "test_missing_file_names_row_and_column": SNAKEMAKE,
        "test_unreadable_raster_names_row_and_column": SNAKEMAKE,
        "test_wrong_band_count_names_expected_and_found": SNAKEMAKE,
        "test_cdl_without_overlap_names_row_and_column": SNAKEMAKE,
        "test_unknown_key_in_config_yaml_is_rejected": SNAKEMAKE,
        "test_unknown_key_in_train_config_is_rejected": SNAKEMAKE,
    },
    "tests/prep/test_predict_only_rows.py": {
        "test_a_prediction_only_row_that_no_run_can_map_is_refused_before_any_job": SNAKEMAKE,
    },
    "tests/test_style.py": {
        "test_style_check_passes[snakemake --lint]": "snakemake --lint parses the workflow",
    },
    "tests/bench/test_gpu_bench.py": {
        "test_gpu_bench_tiny_cpu": "the GPU benchmark end to end on the CPU (~15 s)",
    },
    "tests/evaluation/test_region_maps.py": {
        "test_a_failed_job_leaves_its_maps_staged_and_the_next_attempt_keeps_them":
            "predict runs twice (~8 s)",
        "test_maps_staged_with_another_checkpoint_are_made_again": "predict runs twice (~7 s)",
        "test_a_job_stopped_by_a_signal_exits_75_and_its_retry_maps_only_the_rest":
            "predict in a subprocess, signalled and retried",
    },
    "tests/evaluation/test_run_identity.py": {
        "test_evaluating_after_the_data_changed_is_refused": "evaluate runs (~10 s)",
        "test_evaluating_another_runs_checkpoint_is_refused_and_keeps_the_runs_results":
            "evaluate runs (~8 s)",
    },
    "tests/prep/test_channel_stats.py": {
        "test_stats_json_records_the_seeded_sample": "four channel_stats runs (~15 s)",
    },
    "tests/prep/test_bad_moments.py": {
        "test_n_tiles_takes_all_or_a_positive_number": "channel_stats runs (~7 s)",
    },
    "tests/test_stage_runner.py": {
        "test_train_on_a_config_that_is_not_a_mapping_is_exit_2_naming_it":
            "the train CLI in a subprocess (~7 s)",
    },
}  # fmt: skip
# Under pytest-xdist (README: `pytest -n 2`; pyproject: `--dist loadscope`, so each module's
# tests run in one worker process and its module fixtures are built once) these modules start
# first, longest first, then the rest of the slow tier, then the quick tier: a long module
# started last would leave the other worker idle while it runs. Seconds in CI, 2 workers.
LONGEST_FIRST: dict[str, int] = {
    "tests/test_slurm.py": 800,
    "tests/reliability/test_real_forms.py": 450,
    "tests/test_workflow.py": 250,
    "tests/cluster/test_two_nodes.py": 250,
    "tests/reliability/test_crash_resume.py": 200,
    "tests/cluster/test_scale_dry_run.py": 150,
    "tests/areas/test_workflow_areas.py": 140,
    "tests/training/test_train_resume.py": 110,
    "tests/cluster/test_profiles.py": 100,
    "tests/reliability/test_kill_during_save.py": 90,
}
# node id or its prefix (a file, a class, a function, one parameter) -> why it is slow
SLOW_TESTS: dict[str, str] = {
    (f"{file}::{test}" if test else file): why
    for file, tests in SLOW_FILES.items()
    for test, why in (tests.items() if isinstance(tests, dict) else [("", tests)])
}


def _split(node_id: str) -> tuple[str, list[str], str | None]:
    """``file::Class::test[param]`` -> (file, [Class, test], param)."""
    path, *names = node_id.split("::")
    param = None
    if names and "[" in names[-1]:
        names[-1], param = names[-1][:-1].split("[", 1)
    return path, names, param


def _defined(tree: ast.Module, names: list[str]) -> bool:
    """Whether ``names`` (a class chain ending in a function or class) is defined in ``tree``."""
    body: Iterable[ast.stmt] = tree.body
    for name in names:
        found = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                      ast.ClassDef)) and n.name == name), None)  # fmt: skip
        if found is None:
            return False
        body = found.body
    return True


def _matches(node_id: str, entry: str) -> bool:
    return node_id == entry or node_id.startswith((f"{entry}::", f"{entry}["))


def _fixture_files(item: pytest.Item, root: Path) -> dict[str, str]:
    """{"file::fixture": name} for every fixture ``item`` needs (the definitions it resolves)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a test function (a doctest, a style check of another plugin)
        return {}
    out = {}
    for name, defs in info.name2fixturedefs.items():
        try:
            source = Path(inspect.getsourcefile(inspect.unwrap(defs[-1].func)) or "").resolve()
            out[f"{source.relative_to(root).as_posix()}::{name}"] = name
        except (TypeError, ValueError):  # a builtin or a plugin's fixture, outside the repo
            continue
    return out


def check(root: Path, items: list[pytest.Item], args: list[str], whole: bool) -> list[str]:
    """Entries (of every list here) that name nothing: a missing file, test, class or fixture, or
    a parameter that its collected function no longer has. Only entries of the files collected,
    unless ``whole`` (all of tests/ collected): a run of other files is not stopped by an entry
    it cannot use."""
    problems, trees = [], {}
    files = {item.nodeid.split("::", 1)[0] for item in items}
    for entry in [*SLOW_TESTS, *SLOW_FIXTURES, *LONGEST_FIRST]:
        path, names, param = _split(entry)
        file = root / path
        if not whole and path not in files:
            continue
        if not file.is_file():
            problems.append(f"{entry}: no file {path}")
            continue
        tree = trees.setdefault(path, ast.parse(file.read_text(), str(file)))
        if names and not _defined(tree, names):
            problems.append(f"{entry}: {'::'.join(names)} is not defined in {path}")
        elif param is not None and not any("[" in arg for arg in args):
            base = entry.split("[", 1)[0]
            collected = [item.nodeid for item in items if _matches(item.nodeid, base)]
            if collected and not any(_matches(n, entry) for n in collected):
                problems.append(f"{entry}: collected {base} has no parameter [{param}]")
    return problems


def mark(root: Path, items: list[pytest.Item]) -> None:
    """Add ``slow`` (with its reason) to every item that a marker, fixture or entry makes slow."""
    for item in items:
        reasons = [why for name, why in SLOW_MARKERS.items() if item.get_closest_marker(name)]
        reasons += [SLOW_FIXTURES[f] for f in _fixture_files(item, root) if f in SLOW_FIXTURES]
        reasons += [why for entry, why in SLOW_TESTS.items() if _matches(item.nodeid, entry)]
        if reasons and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow(reason=reasons[0]))


def order(items: list[pytest.Item]) -> None:
    """Sort ``items`` by module as :data:`LONGEST_FIRST` says, then slow modules (a module with
    a slow test) before quick ones; stable, so each module keeps its own order of tests."""
    first = sorted(LONGEST_FIRST, key=LONGEST_FIRST.__getitem__, reverse=True)
    rank = {path: i for i, path in enumerate(first)}
    slow = {_module(item) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: (rank.get(_module(item), len(rank)), _module(item) not in slow))


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]
