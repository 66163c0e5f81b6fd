rule evaluate:
    input:
        trained="results/runs/{run}/train.json",
    output:
        metrics="results/eval/{run}/metrics.json",
        per_class="results/eval/{run}/per_class.csv",
    log:
        "logs/evaluate/{run}.log",
    benchmark:
        "benchmarks/evaluate/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    params:
        checkpoint="results/runs/{run}/best.pt",
    shell:
        "OMP_NUM_THREADS={threads} python -m emb.evaluate --checkpoint {params.checkpoint}"
        " --metrics {output.metrics} --per-class {output.per_class} > {log} 2>&1"
