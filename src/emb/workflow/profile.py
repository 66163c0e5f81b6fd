"""Checks the cluster profiles run while Snakemake reads them, before any job is submitted.

``profiles/<cluster>/config.v8+.yaml`` are YTE templates (``__use_yte__: true``) that import
these functions, so a missing account variable, a GPU count the nodes do not have or a missing
container image stops ``snakemake --profile ...`` with one clear line instead of a rejected
``sbatch`` (or a job that waits a day in the queue and then fails).

A dry run (``-n``) submits nothing, so it must work on any machine: there a missing variable or
image is a warning and a placeholder stands in, and the dry run lists every job with its
resources. A real run keeps refusing with the error.
"""

from __future__ import annotations

import builtins
import keyword
import math
import os
import sys
from collections.abc import Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Protocol

DRY_RUN_FLAGS = ("--dry-run", "--dryrun")


class ProfileError(ValueError):
    """A cluster profile that cannot work as configured."""


def is_dry_run(argv: Sequence[str] | None = None) -> bool:
    """True when Snakemake's command line (``argv``, default ``sys.argv``) asks for a dry run."""
    args = list(sys.argv[1:] if argv is None else argv)
    for arg in args:
        if arg == "--":
            break
        if arg in DRY_RUN_FLAGS or (
            arg.startswith("-") and not arg.startswith("--") and "n" in arg
        ):
            return True
    return False


def _missing(message: str, placeholder: str, argv: Sequence[str] | None) -> str:
    if not is_dry_run(argv):
        raise ProfileError(message)
    print(f"warning: {message} (dry run: using {placeholder!r})", file=sys.stderr)
    return placeholder


def require_env(
    name: str, hint: str, env: Mapping[str, str] | None = None,
    argv: Sequence[str] | None = None,
) -> str:  # fmt: skip
    """The value of environment variable ``name``; a clear error naming it when unset or empty
    (in a dry run: a warning and the placeholder ``<NAME>``)."""
    value = (os.environ if env is None else env).get(name, "")
    if not value:
        return _missing(f"environment variable {name} is not set: {hint}", f"<{name}>", argv)
    return value


def gpus_per_node(asked: int, cluster: str, available: int) -> int:
    """``asked`` when the cluster's nodes have that many GPUs, else an error naming both."""
    if not 1 <= asked <= available:
        raise ProfileError(
            f"profile {cluster}: asks for {asked} GPUs per node, but {cluster} nodes have "
            f"{available} (1..{available} allowed)"
        )
    return asked


def container_image(path: str, variable: str, argv: Sequence[str] | None = None) -> str:
    """``path`` (from ``variable``) when it is an existing image file, else an error (in a dry
    run: a warning, and the path stands as it is)."""
    if not Path(path).is_file():
        return _missing(f"container image {path} (from {variable}) does not exist", path, argv)
    return path


def group_size(members: object, group: str, cluster: str) -> int:
    """``members`` jobs per SLURM job of ``group`` (``group-components``): a whole number >= 1,
    else an error naming the profile, the group and the value (Snakemake's own message names
    neither)."""
    if isinstance(members, bool) or not isinstance(members, int) or members < 1:
        raise ProfileError(
            f"profile {cluster}: group-components {group}: expected a whole number of jobs per "
            f"SLURM job, at least 1, found {members!r}"
        )
    return members


def positive_number(value: object, key: str, rule: str) -> float:
    """A profile resource that must be a number > 0 (a rate, a time limit), named if not.
    Snakemake hands over resources that are not whole numbers as strings ('1e-06')."""
    number = None
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        with suppress(ValueError):
            number = float(value)
    if number is None or not math.isfinite(number) or number <= 0:
        raise ProfileError(f"profile: rule {rule}: {key}: expected a number > 0, found {value!r}")
    return number


def predict_minutes(megapixels: float, mpx_per_minute: float, processes: int) -> int:
    """Minutes one prediction job asks for: twice the time its ``processes`` need at
    ``mpx_per_minute`` each (reading, writing and a slow node), plus 10 to start."""
    return math.ceil(2 * megapixels / (mpx_per_minute * processes)) + 10


def check_runtime(minutes: int, limit: float | None, job: str, work: str, fix: str) -> None:
    """A job that would outrun its partition's time limit (``max_runtime``, minutes) is refused
    before anything is submitted: SLURM would only kill it after hours in the queue."""
    if limit is not None and minutes > limit:
        raise ProfileError(
            f"profile: {job}: {work} needs about {minutes} min, more than the partition's limit "
            f"max_runtime={limit:g} min; {fix}"
        )


class ResourceSettings(Protocol):
    """What the workflow reads of Snakemake's ``workflow.resource_settings``: the profile's
    ``set-resources`` (rule -> name -> value) and ``default-resources``."""

    overwrite_resources: Mapping[str, Mapping[str, object]]
    default_resources: Mapping[str, object] | None


def profile_resource(settings: ResourceSettings, rule: str, name: str) -> object:
    """A resource of ``rule`` as the profile sets it (set-resources, else default-resources),
    or None: read while the workflow is parsed, so the profile is checked before any job."""
    for given in (settings.overwrite_resources.get(rule, {}), settings.default_resources or {}):
        if name in given:
            return getattr(given[name], "raw", given[name])  # Snakemake's Resource or a value
    return None


def passed_as_is(value: object) -> bool:
    """True when Snakemake hands a profile's string resource ``value`` to every job unchanged:
    it evaluates each such string as a Python expression once per job (``eval``, with the job's
    ``wildcards``, ``attempt``, ... and its helpers defined) and keeps the string where that
    fails. Here: not Python at all, or one name that neither Python nor Snakemake defines
    (``small``, ``project_465000123``); anything else may evaluate to something else."""
    if not isinstance(value, str) or "$" in value or value.startswith("~"):
        return False  # not a string, or one whose variables are expanded per job
    try:
        compile(value, "<resource>", "eval")
    except SyntaxError:
        return True
    if not value.isidentifier() or keyword.iskeyword(value) or hasattr(builtins, value):
        return False
    from snakemake.ioutils import register_in_globals  # the helpers the expression sees

    defined: dict[str, object] = {}
    register_in_globals(defined)
    per_job = {"wildcards", "input", "attempt", "threads", "system_tmpdir", "shutil", "async_run"}
    return value not in defined and value not in per_job


def fixed_strings(settings: ResourceSettings, rule: str, names: Sequence[str]) -> dict[str, str]:
    """The profile's string resources ``names`` of ``rule`` that every job gets as they are
    (:func:`passed_as_is`), as plain values for the rule's own ``resources:``: Snakemake
    evaluates a string given by the profile for every job (a per-region rule's account and
    partition: ~2 of its 6 evaluated resources, ~6% of a 1,000-region dry run's CPU), and a
    plain value of the rule never. The profile still decides them (set-resources, then
    default-resources); a set-resources given later on the command line still wins."""
    values = {name: profile_resource(settings, rule, name) for name in names}
    return {name: value for name, value in values.items() if passed_as_is(value)}  # type: ignore[misc]


def wants_gpus(settings: ResourceSettings, rule: str) -> bool:
    """The profile gives ``rule`` GPUs (gpus_per_node, a gpu gres or --gpus in slurm_extra)."""
    gpus = profile_resource(settings, rule, "gpus_per_node")
    gres = str(profile_resource(settings, rule, "gres") or "")
    extra = str(profile_resource(settings, rule, "slurm_extra") or "")
    return bool(isinstance(gpus, int) and gpus > 0 or "gpu" in gres or "--gpus" in extra)


def check_gpu_partitions(settings: ResourceSettings) -> None:
    """A rule asking for GPUs on the profile's default partition (its CPU partition) would wait
    in a queue that has no GPU, or be refused by sbatch after the earlier jobs ran."""
    default = (settings.default_resources or {}).get("slurm_partition")
    cpu = getattr(default, "raw", default)
    for rule in settings.overwrite_resources:
        partition = profile_resource(settings, rule, "slurm_partition")
        if cpu and partition == cpu and wants_gpus(settings, rule):
            raise ProfileError(
                f"profile: rule {rule} asks for GPUs on partition {partition!r}, the profile's "
                f"CPU partition (default-resources); expected a GPU partition in its "
                f"set-resources"
            )


CPU_MPX_PER_MINUTE = 3  # one CPU thread (bench/predict.py: 0.06 megapixels/s)


def predict_runtime(settings: ResourceSettings, job: str, megapixels: float, regions: int) -> int:
    """Minutes a prediction job of ``regions`` regions (``megapixels`` in all) asks for, at the
    profile's ``mpx_per_minute`` per process (a CPU thread's rate without one) on predict's
    nodes x tasks_per_node processes; refused when more than the profile's ``max_runtime``
    (the partition's limit). ``job`` names it in the error."""
    rate = profile_resource(settings, "predict", "mpx_per_minute")
    limit = profile_resource(settings, "predict", "max_runtime")
    processes = profile_resource(settings, "predict", "nodes") or 1
    processes *= profile_resource(settings, "predict", "tasks_per_node") or 1  # type: ignore[operator]
    rate = (
        CPU_MPX_PER_MINUTE if rate is None else positive_number(rate, "mpx_per_minute", "predict")
    )
    limit = None if limit is None else positive_number(limit, "max_runtime", "predict")
    minutes = predict_minutes(megapixels, rate, int(processes))  # type: ignore[arg-type]
    check_runtime(
        minutes,
        limit,
        job,
        f"{regions} regions, {megapixels:.0f} megapixels at {rate:g} megapixels/min "
        f"on each of {processes} processes",
        "give predict more nodes (set-resources: predict: nodes) or split the regions table",
    )
    return minutes


def launched_processes(resources: Mapping[str, object], job: str) -> int:
    """Processes of one launched job as the profile submits it: its ``nodes`` x
    ``tasks_per_node`` (``resources``: the rule's, each a value or Snakemake's Resource).
    Whole numbers, else an error naming the job (a callable resource is not known yet)."""
    counts = {
        key: getattr(resources[key], "raw", resources[key]) for key in ("nodes", "tasks_per_node")
    }
    if not all(isinstance(v, int) for v in counts.values()):
        raise ProfileError(
            f"{job} job's resources nodes and tasks_per_node: expected integers, found {counts}"
        )
    return counts["nodes"] * counts["tasks_per_node"]  # type: ignore[operator]


def threads_per_process(threads: int, given: object, tasks_per_node: int) -> int:
    """CPU threads of each launched process: the profile's ``cpus_per_task`` (``given``) when
    set, else the rule's ``threads`` shared by the ``tasks_per_node`` processes of a node."""
    return given if given else max(1, threads // tasks_per_node)  # type: ignore[return-value]


def local_node(env: Mapping[str, str] | None = None, meminfo: str = "/proc/meminfo") -> dict:
    """The node scripts/slurm/start.sh makes of this machine: ``SLURM_LOCAL_CPUS`` cores (all
    of them by default) and ``SLURM_LOCAL_MEM_MB`` MB (85% of the RAM by default)."""
    env = os.environ if env is None else env
    cores = int(env.get("SLURM_LOCAL_CPUS") or os.cpu_count() or 1)
    mem_mb = env.get("SLURM_LOCAL_MEM_MB")
    if not mem_mb:
        total_kb = next(
            int(line.split()[1]) for line in Path(meminfo).read_text().splitlines()
            if line.startswith("MemTotal:")
        )  # fmt: skip
        mem_mb = int(total_kb / 1024 * 0.85)
    return {"cores": cores, "mem_mb": int(mem_mb)}
