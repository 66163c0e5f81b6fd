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
        region=one_of(DEMO_NAMES),
    conda:
        "../../envs/emb.yaml"
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    params:
        size=config["demo"]["size"],
        seed=config["demo"]["seed"],
        out_dir=lambda wildcards, output: Path(output.aef).parent,
    shell:
        "python -m emb.prep.demo_region --region={wildcards.region:q} --size={params.size:q}"
        " --seed={params.seed:q} --classes={input.classes:q} --out-dir={params.out_dir:q}"
        " > {log:q} 2>&1"
