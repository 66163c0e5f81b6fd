rule summary:
    input:
        metrics=expand("results/eval/{run}/metrics.json", run=RUNS),
    output:
        report(
            "results/summary.csv",
            caption="../report/summary.rst",
            category="Summary",
        ),
    log:
        "logs/summary.log",
    benchmark:
        "benchmarks/summary.tsv"
    params:
        runs=RUNS,
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    shell:
        "python -m emb.summary --runs {params.runs} --metrics {input.metrics}"
        " --out {output} > {log} 2>&1"
