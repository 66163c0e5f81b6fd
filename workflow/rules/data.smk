rule tessera_npy:
    input:
        unpack(get_tessera_npy),
    output:
        "results/converted/tessera/{region}.tif",
    log:
        "logs/tessera_npy/{region}.log",
    benchmark:
        "benchmarks/tessera_npy/{region}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        # peak 396 MB converting an 1100 x 1100 x 128 tile (a geotessera tile's size) with its
        # memory-mapped .npy pages, x 1.5; doubled at each retry (a job killed for memory)
        mem_mb=lambda wildcards, attempt: 600 * 2 ** (attempt - 1),
        runtime=30,
    params:
        year=lambda wildcards: TABLE.cell(wildcards.region, "year"),
    shell:
        "python -m emb.prep.tessera_npy --npy={input.npy:q} --out={output:q}"
        " --year={params.year:q} > {log:q} 2>&1"


rule regions_table:
    input:
        config["regions"] or [],  # "": the areas give every region
    output:
        "results/regions.tsv",
    log:
        "logs/regions_table.log",
    params:
        rows=lambda wildcards: TABLE.jobs_table().to_csv(sep="\t", index=False),
    run:
        region_table.write_jobs_table(output[0], log[0], params.rows)


# One job per (source, region) runs both stages: the CDL labels aligned on the embedding
# raster's grid, then that pair's shards. As two rules they were 2,000 of a 1,000-region DAG's
# jobs, and Snakemake's per-job work (the DAG, the job list, a group's ready check, quadratic in
# its members) made most of a cluster dry run's time (bench/dry_run.py). The outputs are the
# two stages' own: every consumer reads the same files.
rule shards:
    input:
        emb=get_emb,
        cdl=get_cdl,
        classes=config["classes"],
    output:
        labels="results/labels/{source}/{region}.tif",
        report="results/labels/{source}/{region}.json",
        index="results/shards/{source}/{region}/index.json",
    log:
        "logs/shards/{source}/{region}.log",
    benchmark:
        "benchmarks/shards/{source}/{region}.tsv"
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        **profile_strings("shards"),
        # measured (workflow/rules/cluster.smk): the larger peak, the two stages' times summed
        mem_mb=region_mem_mb("align_labels", "shards"),
        runtime=region_runtime("align_labels", "shards"),
    params:
        split=get_split,
        group=split_group,
        tiles=source_settings("tiles"),
        splits=source_settings("splits"),
        shards=source_settings("shards"),
    shell:
        "python -m emb.prep.align_labels --emb={input.emb:q} --cdl={input.cdl:q}"
        " --classes={input.classes:q} --out={output.labels:q} --report={output.report:q}"
        " > {log:q} 2>&1"
        " && python -m emb.prep.shards --source={wildcards.source:q}"
        " --region={wildcards.region:q}"
        " --emb={input.emb:q} --labels={output.labels:q} --index={output.index:q}"
        " --tile-size={params.tiles[size]:q} --stride={params.tiles[stride]:q}"
        " --min-valid={params.tiles[min_valid]:q} --block-m={params.splits[block_m]:q}"
        " --fractions {params.splits[fractions]:q} --seed={params.splits[seed]:q}"
        " --buffer-m={params.splits[buffer_m]:q}"
        " --split={params.split:q} --split-key={params.group[key]:q}"
        " --split-extent={params.group[extent]:q} --max-samples={params.shards[max_samples]:q}"
        " --max-bytes={params.shards[max_bytes]:q} >> {log:q} 2>&1"


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
        # each run's val batch must score on the ranks: checked whenever the manifest is
        # made; derived (it takes input), so a run's new batch size reruns no other run
        # through a new manifest (its training checks again when it starts)
        validation=lambda wildcards, input: validation_batches(wildcards),
    shell:
        "python -m emb.prep.manifest --out={output:q} --ranks={params.ranks:q}"
        " --workers={params.workers:q} {params.validation} -- {input:q} > {log:q} 2>&1"
