rule demo_region:
    input:
        classes=config["classes"],
    output:
        aef="resources/demo/{region}/aef.tif",
        tessera="resources/demo/{region}/tessera.tif",
        cdl="resources/demo/{region}/cdl.tif",
    log:
        "logs/demo_region/{region}.log",
    benchmark:
        "benchmarks/demo_region/{region}.tsv"
    wildcard_constraints:
        region="|".join(DEMO_NAMES),
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        size=config["demo"]["size"],
        seed=config["demo"]["seed"],
    shell:
        "python -m emb.prep.demo_region --region {wildcards.region} --size {params.size} --seed {params.seed}"
        " --classes {input.classes} --out-dir resources/demo/{wildcards.region} > {log} 2>&1"
