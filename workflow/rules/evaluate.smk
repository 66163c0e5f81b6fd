rule evaluate:
    input:
        trained="results/runs/{run}/train.json",
        classes=config["classes"],
    output:
        metrics="results/eval/{run}/metrics.json",
        per_class=report(
            "results/eval/{run}/per_class.csv",
            caption="../report/per_class.rst",
            category="Runs",
            subcategory="{run}",
            labels={"run": "{run}", "figure": "per-class scores (CSV)"},
        ),
        confusion_l1=report(
            "results/eval/{run}/confusion_l1.png",
            caption="../report/confusion.rst",
            category="Runs",
            subcategory="{run}",
            labels={"run": "{run}", "figure": "confusion L1"},
        ),
        confusion_l2=report(
            "results/eval/{run}/confusion_l2.png",
            caption="../report/confusion.rst",
            category="Runs",
            subcategory="{run}",
            labels={"run": "{run}", "figure": "confusion L2"},
        ),
        confusion_l3=report(
            "results/eval/{run}/confusion_l3.png",
            caption="../report/confusion.rst",
            category="Runs",
            subcategory="{run}",
            labels={"run": "{run}", "figure": "confusion L3"},
        ),
        iou=report(
            "results/eval/{run}/iou.png",
            caption="../report/iou.rst",
            category="Runs",
            subcategory="{run}",
            labels={"run": "{run}", "figure": "per-class IoU"},
        ),
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
        mem_mb=4000,
        runtime=60,
        nodes=1,
        tasks_per_node=1,
        gpus_per_node=0,
    params:
        run_dir=lambda wildcards, input: Path(input.trained).parent,
        out_dir=lambda wildcards, output: Path(output.metrics).parent,
        launch=launch_options,
        threads=lambda wildcards, threads, resources: max(
            1, threads // resources.tasks_per_node
        ),
    shell:
        "python -m emb.cluster.launch {params.launch} -- emb.evaluation.evaluate"
        " --run-dir={params.run_dir:q} --classes={input.classes:q} --out-dir={params.out_dir:q}"
        " --threads={params.threads:q} > {log:q} 2>&1"


rule predict:
    input:
        trained="results/runs/{run}/train.json",
        raster=get_region_raster,
        cdl=get_cdl,  # its colour table, when it holds one, colours the map
        classes=config["classes"],
    output:
        **predict_extra_outputs(),
        map="results/maps/{run}/{region}.tif",
        qml="results/maps/{run}/{region}.qml",  # QGIS loads it with the map: named classes
        png=report(
            "results/maps/{run}/{region}.png",
            caption="../report/map.rst",
            category="Maps",
            subcategory="{run}",
            labels={"run": "{run}", "region": "{region}"},
        ),
    log:
        "logs/predict/{run}/{region}.log",
    benchmark:
        "benchmarks/predict/{run}/{region}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 2
    resources:
        mem_mb=8000,
        runtime=120,
    params:
        run_dir=lambda wildcards, input: Path(input.trained).parent,
        options=predict_options,
    shell:
        "OMP_NUM_THREADS={threads} python -m emb.evaluation.predict"
        " --run-dir={params.run_dir:q} --raster={input.raster:q} --region={wildcards.region:q}"
        " --classes={input.classes:q} --cdl={input.cdl:q} --out={output.map:q}"
        " --qml={output.qml:q} --png={output.png:q}"
        " --threads={threads} {params.options} > {log:q} 2>&1"
