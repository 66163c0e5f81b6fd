rule evaluate:
    input:
        trained="results/runs/{run}/train.json",
        manifest=run_manifest,  # its test split: what is scored
        classes=config["classes"],
    output:
        metrics="results/eval/{run}/metrics.json",
        blocks="results/eval/{run}/blocks.npz",  # per-block confusions (the bootstrap's unit)
        per_class=report_file(
            "results/eval/{run}/per_class.csv",
            "per_class",
            "Runs",
            "per-class scores (CSV)",
        ),
        confusion_l1=report_file(
            "results/eval/{run}/confusion_l1.png", "confusion", "Runs", "confusion L1"
        ),
        confusion_l2=report_file(
            "results/eval/{run}/confusion_l2.png", "confusion", "Runs", "confusion L2"
        ),
        confusion_l3=report_file(
            "results/eval/{run}/confusion_l3.png", "confusion", "Runs", "confusion L3"
        ),
        iou=report_file("results/eval/{run}/iou.png", "iou", "Runs", "per-class IoU"),
    log:
        "logs/evaluate/{run}.log",
    benchmark:
        "benchmarks/evaluate/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    container:
        None  # as for train: the launcher runs the container inside its srun step
    threads: 2
    resources:
        mem_mb=launched_mem_mb("evaluate"),  # measured (workflow/rules/cluster.smk)
        runtime=60,
        nodes=1,
        tasks_per_node=1,
        gpus_per_node=0,
        attempt=lambda wildcards, attempt: attempt,
    params:
        run_dir=lambda wildcards, input: Path(input.trained).parent,
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
        launch=launch_options,
        threads=threads_per_process,
        failed="results/eval/{run}.failed.json",  # a failure a retry would only repeat
    shell:
        "python -m emb.cluster.launch {params.launch} --attempt={resources.attempt:q}"
        " --failure-record={params.failed:q} -- emb.evaluation.evaluate"
        " --run-dir={params.run_dir:q} --classes={input.classes:q} --out-dir={params.out_dir:q}"
        " --threads={params.threads:q} > {log:q} 2>&1"


rule predict:
    input:
        trained="results/runs/{run}/train.json",
        regions="results/regions.tsv",  # the table as jobs read it (converted .npy tiles)
        rasters=get_run_rasters,
        cdls=get_run_cdls,  # their colour tables, when they hold one, colour the maps
        classes=config["classes"],
    output:
        # {region}.tif, .tif.aux.xml, .qml, .png (+ _probabilities.tif) of every region
        maps=report(
            directory("results/maps/{run}"),
            patterns=["{region}.png"],
            caption="../report/map.rst",
            category=map_category,  # prediction-only regions in a section of their own
            subcategory="{run}",
            labels=map_labels,
        ),
    log:
        "logs/predict/{run}.log",
    benchmark:
        "benchmarks/predict/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    container:
        None  # as for evaluate: the launcher runs the container inside its srun step
    threads: 8  # at most the cores Snakemake has: a laptop's maps use all of them
    resources:
        mem_mb=launched_mem_mb("predict"),  # measured (workflow/rules/cluster.smk)
        runtime=predict_runtime,
        nodes=1,
        tasks_per_node=1,
        gpus_per_node=0,
        attempt=lambda wildcards, attempt: attempt,
    params:
        run_dir=lambda wildcards, input: Path(input.trained).parent,
        launch=launch_options,
        threads=threads_per_process,
        options=lambda wildcards: predict_options(config["predict"]),
        # finished maps wait here (kept by a retry); .stopped: a signal stopped the job (exit
        # 75, worth a retry); failed.json: any other failure, which a retry repeats at once
        staging="results/maps/.partial/{run}",
        stopped="results/maps/.partial/{run}/.stopped",
        failed="results/maps/.partial/{run}.failed.json",
    shell:
        "python -m emb.cluster.launch {params.launch} --checkpoint={params.stopped:q}"
        " --attempt={resources.attempt:q} --failure-record={params.failed:q}"
        " -- emb.evaluation.predict --run-dir={params.run_dir:q} --regions={input.regions:q}"
        " --classes={input.classes:q} --out-dir={output.maps:q} --staging={params.staging:q}"
        " --threads={params.threads:q} {params.options} > {log:q} 2>&1"
