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
        source=lambda wildcards: RUN_SOURCE[wildcards.run],
        classes=config["classes"],
    shell:
        "python -m emb.config {input.files} --schema {input.schema} --out {output}"
        " --set data.manifest=results/shards/{params.source}/manifest.json"
        " --set data.stats_dir=results/stats/{params.source}"
        " --set data.classes={params.classes} > {log} 2>&1"


# Checkpoints (best.pt, last.pt) are not declared outputs: Snakemake deletes the outputs of a
# failed job, and a stopped run must keep them to resume.
rule train:
    input:
        unpack(get_run_inputs),
    output:
        "results/runs/{run}/train.json",
    log:
        "logs/train/{run}.log",
    benchmark:
        "benchmarks/train/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: config["train"]["nproc_per_node"] * config["train"]["threads"]
    resources:
        mem_mb=8000,
        runtime=600,
    params:
        nproc=config["train"]["nproc_per_node"],
        threads=config["train"]["threads"],
    shell:
        "OMP_NUM_THREADS={params.threads} torchrun --standalone"
        " --nproc_per_node={params.nproc} -m emb.train --config {input.config} > {log} 2>&1"
