rule align_labels:
    input:
        emb=get_emb,
        cdl=get_cdl,
        classes=config["classes"],
    output:
        labels="results/labels/{source}/{region}.tif",
        report="results/labels/{source}/{region}.json",
    log:
        "logs/align_labels/{source}/{region}.log",
    benchmark:
        "benchmarks/align_labels/{source}/{region}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=60,
    shell:
        "python -m emb.prep.align_labels --emb {input.emb} --cdl {input.cdl} --classes {input.classes}"
        " --out {output.labels} --report {output.report} > {log} 2>&1"


rule shards:
    input:
        emb=get_emb,
        labels="results/labels/{source}/{region}.tif",
    output:
        index="results/shards/{source}/{region}/index.json",
    log:
        "logs/shards/{source}/{region}.log",
    benchmark:
        "benchmarks/shards/{source}/{region}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        split=get_split,
        tiles=config["tiles"],
        splits=config["splits"],
        shards=config["shards"],
    shell:
        "python -m emb.prep.shards --source {wildcards.source} --region {wildcards.region}"
        " --emb {input.emb} --labels {input.labels} --index {output.index}"
        " --tile-size {params.tiles[size]} --stride {params.tiles[stride]}"
        " --min-valid {params.tiles[min_valid]} --block-m {params.splits[block_m]}"
        " --fractions {params.splits[fractions]} --seed {params.splits[seed]}"
        " --buffer-m {params.splits[buffer_m]}"
        " --split {params.split} --max-samples {params.shards[max_samples]}"
        " --max-bytes {params.shards[max_bytes]} > {log} 2>&1"


rule manifest:
    input:
        get_region_indexes,
    output:
        "results/shards/{source}/manifest.json",
    log:
        "logs/manifest/{source}.log",
    benchmark:
        "benchmarks/manifest/{source}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=10,
    params:
        ranks=training_ranks,  # as rule train is submitted under this profile
        workers=loader_workers,
    shell:
        "python -m emb.prep.manifest {input} --out {output} --ranks {params.ranks}"
        " --workers {params.workers} > {log} 2>&1"
