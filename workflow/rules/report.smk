rule summary:
    input:
        metrics=expand("results/eval/{run}/metrics.json", run=RUNS),
        blocks=expand("results/eval/{run}/blocks.npz", run=RUNS),  # paired comparisons
        areas=expand("results/area_estimates/{run}.csv", run=RUNS),  # below the runs table
        # the runs' district layers (polygons and estimates): their maps on the page, if any
        district_layers=samples.district_layers(SETTINGS, RUNS),
    output:
        csv=report_file("results/summary.csv", "summary", "Summary", "table (CSV)"),
        html=report_file("results/summary.html", "summary", "Summary", "table"),
        png=report_file(
            "results/summary.png", "summary_figure", "Summary", "all runs side by side"
        ),
        pairs=report_file(
            "results/pairs.csv", "pairs", "Summary", "paired comparisons (CSV)"
        ),
        pairs_png=report_file(
            "results/pairs.png",
            "pairs_figure",
            "Summary",
            "paired differences (forest plot)",
        ),
        provenance=report_file(
            "results/provenance.html",
            "provenance",
            "Provenance",
            "code, libraries, config and data of each run",
        ),
    log:
        "logs/summary.log",
    benchmark:
        "benchmarks/summary.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        runs=RUNS,
        histories=expand("results/runs/{run}/history.csv", run=RUNS),  # beside train.json
        area_settings=AREA_SETTINGS,  # the areas' interval level, for their labels
    shell:
        "python -m emb.report.summary --runs {params.runs:q} --metrics {input.metrics:q}"
        " --out={output.csv:q} --html={output.html:q} --png={output.png:q}"
        " --provenance={output.provenance:q} --pairs={output.pairs:q} --pairs-png={output.pairs_png:q}"
        " --histories {params.histories:q} --areas {input.areas:q}"
        " --district-layers {input.district_layers:q}"
        " --area-settings={params.area_settings:q} > {log:q} 2>&1"


rule curves:
    input:
        trained="results/runs/{run}/train.json",
    output:
        report_file(
            "results/runs/{run}/curves.png", "curves", "Runs", "training curves"
        ),
    log:
        "logs/curves/{run}.log",
    benchmark:
        "benchmarks/curves/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    params:
        history="results/runs/{run}/history.csv",
    shell:
        "python -m emb.report.curves --history={params.history:q} --run={wildcards.run:q}"
        " --out={output:q} > {log:q} 2>&1"


rule data_report:
    input:
        manifest="results/shards/{source}/manifest.json",
        classes=config["classes"],
    output:
        png=report_file(
            "results/data/{source}.png", "data", "Data", "tiles and classes"
        ),
        html=report_file("results/data/{source}.html", "data", "Data", "tables"),
    log:
        "logs/data_report/{source}.log",
    benchmark:
        "benchmarks/data_report/{source}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    shell:
        "python -m emb.report.data_report --manifest={input.manifest:q}"
        " --classes={input.classes:q} --png={output.png:q} --html={output.html:q}"
        " > {log:q} 2>&1"
