# The files are those common.smk already resolved and checked before any job: defaults, run,
# the demo overlay (demo data only), train_overlays, the profile's train_overlay resource.
rule train_config:
    input:
        files=lambda wildcards: train_config_files(wildcards.run),
        schema=TRAIN_SCHEMA,
    output:
        "results/runs/{run}/config.yaml",
    log:
        "logs/train_config/{run}.log",
    benchmark:
        "benchmarks/train_config/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    params:
        manifest=lambda wildcards: (
            f"data.manifest=results/shards/{RUN_SOURCE[wildcards.run]}/manifest.json"
        ),
        stats_dir=lambda wildcards: f"data.stats_dir=results/stats/{RUN_SOURCE[wildcards.run]}",
        classes=f"data.classes={config['classes']}",
    shell:
        "python -m emb.training.train_config --schema={input.schema:q} --out={output:q}"
        " --set={params.manifest:q} --set={params.stats_dir:q} --set={params.classes:q}"
        " -- {input.files:q} > {log:q} 2>&1"


# Which GPUs and CPUs a job step really gets, in the same form as train (the profiles give both
# rules the same resources). gpus_per_node set by the profile or --set-resources is checked
# strictly (the cluster profiles); left at the rule's default (0, an integer for the SLURM
# plugin) the check expects whatever the machine has, so a local GPU run just works. More
# processes per node than visible GPUs fails either way. What it checks (nodes, processes,
# threads, GPUs) is in its params, so a changed count reruns it (a param that reads resources
# is one Snakemake never compares); train reads the check as ancient: a check rerun for a new
# count does not retrain a finished run by itself (--forcerun train does).
from emb.workflow.stage_options import checked_shape, gpu_request

# The launched shape, one block for both rules: the check vouches for what train gets, so a
# change to one is a change to the other (the profiles' resources override both alike).
LAUNCH_SHAPE = dict(
    nodes=1,
    tasks_per_node=config["launch"]["nproc_per_node"],
    cpus_per_task=config["launch"]["threads"],
    gpus_per_node=0,
)
LAUNCH_THREADS = config["launch"]["nproc_per_node"] * config["launch"]["threads"]


rule gpu_check:
    output:
        "results/gpu_check.json",
    log:
        "logs/gpu_check.log",
    benchmark:
        "benchmarks/gpu_check.tsv"
    conda:
        "../../envs/emb.yaml"
    container:
        None  # the launcher runs the container inside its srun step
    threads: LAUNCH_THREADS
    resources:
        **LAUNCH_SHAPE,
        mem_mb=2000,
        runtime=10,
    params:
        launch=launch_options,
        gpus=lambda wildcards: gpu_request(workflow.resource_settings),
        shape=lambda wildcards: checked_shape(rules.gpu_check.rule.resources),
    shell:
        "python -m emb.cluster.launch --per-node {params.launch} -- emb.cluster.gpu_check"
        " {params.gpus} {params.shape} --out={output:q} > {log:q} 2>&1"


# Checkpoints (best.pt, last.pt) are not declared outputs: Snakemake deletes the outputs of a
# failed job, and a stopped run must keep them to resume. A run stopped by SLURM's signal or
# its deadline writes ranks/rank0.stopped.json and exits 75; the profiles' retries resume it
# from last.pt. Any other failure leaves launch.failed.json: a retry then ends at once. A
# rerun of a finished run (--forcerun train, a changed config) trains from scratch; the
# earlier run's files move to results/runs/{run}/previous/ (emb.training.run_start).
rule train:
    input:
        unpack(get_run_inputs),
        gpu_check=ancient("results/gpu_check.json"),
    output:
        "results/runs/{run}/train.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    container:
        None  # the launcher runs the container inside its srun step
    threads: LAUNCH_THREADS
    resources:
        **LAUNCH_SHAPE,
        mem_mb=8000,
        runtime=600,
        attempt=lambda wildcards, attempt: attempt,
    params:
        launch=launch_options,
        stopped="results/runs/{run}/ranks/rank0.stopped.json",
        failed="results/runs/{run}/launch.failed.json",
    shell:
        "python -m emb.cluster.launch {params.launch} --checkpoint={params.stopped:q}"
        " --attempt={resources.attempt:q} --failure-record={params.failed:q}"
        " -- emb.training.train --config={input.config:q} >> {log:q} 2>&1"


# Before any job: a run whose lr_scaling takes optimizer.lr to where the seeds saw its
# architecture diverge is warned about here, with its world size as the profile submits it.
from snakemake.logging import logger
from emb.workflow.parsed_runs import lr_warning_lines

for _run, _cfg in RUN_CONFIG.items():
    for _line in lr_warning_lines(_cfg, training_ranks(None)):
        logger.warning(f"train config of run {_run!r}: {_line}")
