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
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    params:
        runs=RUNS,
    shell:
        "python -m emb.summary --runs {params.runs} --metrics {input.metrics}"
        " --out {output} > {log} 2>&1"
