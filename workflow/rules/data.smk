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
        "python -m emb.prep.align_labels --emb={input.emb:q} --cdl={input.cdl:q}"
        " --classes={input.classes:q} --out={output.labels:q} --report={output.report:q}"
        " > {log:q} 2>&1"


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
        "python -m emb.prep.shards --source={wildcards.source:q} --region={wildcards.region:q}"
        " --emb={input.emb:q} --labels={input.labels:q} --index={output.index:q}"
        " --tile-size={params.tiles[size]:q} --stride={params.tiles[stride]:q}"
        " --min-valid={params.tiles[min_valid]:q} --block-m={params.splits[block_m]:q}"
        " --fractions {params.splits[fractions]:q} --seed={params.splits[seed]:q}"
        " --buffer-m={params.splits[buffer_m]:q}"
        " --split={params.split:q} --max-samples={params.shards[max_samples]:q}"
        " --max-bytes={params.shards[max_bytes]:q} > {log:q} 2>&1"


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
        "python -m emb.prep.manifest --out={output:q} --ranks={params.ranks:q}"
        " --workers={params.workers:q} -- {input:q} > {log:q} 2>&1"
