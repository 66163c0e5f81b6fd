rule channel_stats:
    input:
        manifest="results/shards/{source}/manifest.json",
    output:
        mean="results/stats/{source}/channel_mean.npy",
        std="results/stats/{source}/channel_std.npy",
        record="results/stats/{source}/stats.json",
    log:
        "logs/channel_stats/{source}.log",
    benchmark:
        "benchmarks/channel_stats/{source}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 2  # profiles/{lumi,betzy} set 8 (set-threads)
    resources:
        mem_mb=source_mem_mb("channel_stats"),  # measured (workflow/rules/cluster.smk)
        runtime=60,
    params:
        n_tiles=config["stats"]["n_tiles"],
        seed=config["stats"]["seed"],
        out_dir=lambda wildcards, output: Path(output.record).parent,
    shell:
        "python -m emb.prep.channel_stats --manifest={input.manifest:q}"
        " --n-tiles={params.n_tiles:q} --seed={params.seed:q} --threads={threads}"
        " --out-dir={params.out_dir:q} > {log:q} 2>&1"
