"""The options rules hand to their stages' command lines, from the rule's resources and the
workflow's settings: the launcher's (train, gpu_check, evaluate, predict), the GPU check's
expected shape, the runs' validation batches the manifest checks, and predict's window
settings (validated and defaulted by
workflow/schemas/config.schema.yaml). Each is shell-quoted: it reaches a shell."""

from __future__ import annotations

import shlex
from collections.abc import Mapping

from emb.workflow.profile import ResourceSettings, profile_resource


def rule_options(
    resources: Mapping[str, object], container: str = "", container_args: str = ""
) -> str:
    """Launcher options (shell-quoted) from a rule's resources, as the profiles set them.

    ``nodes``, ``tasks_per_node`` (processes per node), ``cpus_per_task`` (threads each);
    ``mpi: srun`` (the plugin's marker for rules that call srun themselves) turns on ``--srun``;
    ``rendezvous`` and ``launch_env`` (space-separated NAME=VALUE) pass through. The container
    is used only with ``--srun``: without it the rule runs inside Snakemake's own container.
    """
    srun = resources.get("mpi") == "srun"
    options = ["--nodes", str(resources.get("nodes", 1)),
               "--nproc-per-node", str(resources.get("tasks_per_node", 1)),
               "--threads", str(resources.get("cpus_per_task", 1))]  # fmt: skip
    if srun:
        options.append("--srun")
    if container:
        options += ["--container", container, "--container-args", container_args]
    if resources.get("rendezvous"):
        options += ["--rendezvous", str(resources["rendezvous"])]
    for item in str(resources.get("launch_env") or "").split():
        options += ["--env", item]
    return shlex.join(options)


def gpu_request(
    settings: ResourceSettings,
    rule: str = "gpu_check",
) -> str:
    """``gpu_check``'s options for the GPUs ``rule`` expects: ``--gpus=N`` and where N was
    set when the profile or ``--set-resources`` sets ``gpus_per_node``, else ``--gpus=auto``.

    Read from Snakemake's resource settings, not the rule's resources: the rule keeps the
    integer 0 there (the SLURM plugin is never handed anything else), and a value the profile
    set is told apart from the rule's own default."""
    gpus = profile_resource(settings, rule, "gpus_per_node")
    if gpus is None:
        return "--gpus=auto"
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 0:
        raise ValueError(f"resource {rule}:gpus_per_node: expected an integer >= 0, found {gpus!r}")
    # A fixed text: a param naming the invoking process's profile would differ between the
    # outer Snakemake and a job's inner one, and rerun gpu_check (and every training) each time.
    where = "the profile or --set-resources"
    return shlex.join([f"--gpus={gpus}", f"--source={where}"])


# the check's shape: resource -> its option (gpus_per_node is gpu_request's --gpus)
SHAPE = {"nodes": "--nodes", "tasks_per_node": "--processes", "cpus_per_task": "--threads"}


def checked_shape(resources: Mapping[str, object], rule: str = "gpu_check") -> str:
    """``--nodes``, ``--processes`` and ``--threads`` of the check, from ``rule``'s resources
    as Snakemake built them (the rule's own, then the profile's or ``--set-resources``).

    A param, so that a changed count reruns the check: Snakemake never compares a param that
    takes ``resources`` (a derived one), and a check that saw 1 process would vouch for 3.
    Read from the rule object, not from a job's resources, so it is known without them."""
    options = []
    for key, option in SHAPE.items():
        value = getattr(resources[key], "raw", resources[key]) if key in resources else 1
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"resource {rule}:{key}: expected an integer >= 1, found {value!r}")
        options.append(f"{option}={value}")
    return shlex.join(options)


def predict_options(settings: Mapping[str, object]) -> str:
    """``config["predict"]`` as predict's command-line options, shell-quoted: the window
    overlap, block and batch size always; the window side only when set (else the run's
    training tile), ``--with-probabilities`` only when asked for."""
    options = [
        f"--overlap={settings['overlap']}",
        f"--block={settings['block']}",
        f"--batch-size={settings['batch_size']}",
        *([f"--tile={settings['tile']}"] if settings.get("tile") else []),
        *(["--with-probabilities"] if settings["probabilities"] else []),
    ]
    return shlex.join(options)


def validation_options(parsed_runs: Mapping[str, Mapping], source: str) -> str:
    """Rule manifest's ``--validation`` options, shell-quoted: each run of ``source`` with its
    ``train.batch_size`` and ``train.val_min_batch`` (its config as train_config resolves
    it), so that the manifest refuses a validation split those ranks cannot score before
    any training job is queued."""
    return shlex.join(
        f"--validation={run}:{c['train']['batch_size']}:{c['train']['val_min_batch']}"
        for run, c in parsed_runs.items()
        if c["data"]["source"] == source
    )
