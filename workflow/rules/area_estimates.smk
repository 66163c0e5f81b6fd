# Each class's area in hectares with its interval (Olofsson et al. 2014), per run: the test
# split's check (samples of the map labelled by the CDL), and a user's labelled sample.
from emb.workflow import samples

# A user's sample: drawn by `snakemake results/samples/{run}/sample.csv` (not in `all`), and
# once labelled (area_estimates.labelled) estimated for every run.
with as_workflow_error(samples.ERRORS):
    # the stages' settings, checked once here and passed whole (JSON) to both rules and summary
    SETTINGS = samples.area_settings(config["area_estimates"], config["areas"])
    AREA_SETTINGS = SETTINGS.to_json()
    LABELLED = samples.labelled_inputs(config["area_estimates"]["labelled"])
    # the districts file (or the areas file), read and checked now; with districts (a file,
    # the areas or the regions), each run's district layer is an output
    DISTRICTS = samples.district_inputs(SETTINGS)
    DISTRICT_OUTPUTS = samples.district_outputs(SETTINGS)
    # its rows now, not in the job: a refusal there would delete the runs' area tables
    samples.check_labelled_sample(LABELLED, config["classes"])
    SAMPLE_REGIONS = samples.regions_per_run(
        config["area_estimates"]["design_regions"],
        {run: TABLE.mapped_regions(RUN_SOURCE[run]) for run in RUNS},
    )


rule area_estimates:
    input:
        unpack(
            lambda w: samples.check_inputs(
                TABLE.training_regions(RUN_SOURCE[w.run]), RUN_SOURCE[w.run]
            )
        ),
        maps="results/maps/{run}",
        metrics="results/eval/{run}/metrics.json",  # after evaluate: the run's scores first
        # indexes: each region's test tiles; labels: the CDL on the maps' grid
        classes=config["classes"],
        labelled=LABELLED,  # a user's labelled sample.csv and its design record, if any
        districts=DISTRICTS,  # the districts file (or the areas file), if any
    output:
        # with districts: gpkg={run}_districts.gpkg, the districts' estimates as a GIS layer
        **DISTRICT_OUTPUTS,
        csv=report_file(
            "results/area_estimates/{run}.csv",
            "area_estimates",
            "Crop areas",
            "areas per class (CSV)",
        ),
        png=report_file(
            "results/area_estimates/{run}.png",
            "area_estimates",
            "Crop areas",
            "mapped vs estimated area",
        ),
        # the recommended n and its pilot (the test split's error matrix); sample_design's n: auto
        sample_size="results/area_estimates/{run}_sample_size.json",
    log:
        "logs/area_estimates/{run}.log",
    benchmark:
        "benchmarks/area_estimates/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    # two worker processes count shares of the regions, then draw the check by district's
    # draws in two ranges: 0.57-0.69x the wall time of one process and a reader thread on
    # 2 free cores at 1,000 regions (bench/state_scale.py), the same counts and figures
    threads: 2
    resources:
        mem_mb=4000,
        runtime=30,
    params:
        settings=AREA_SETTINGS,
        # ["--labelled", csv, "--record", json] or none; each word quoted by :q
        labelled=lambda wildcards, input: (
            ["--labelled", input.labelled[0], "--record", input.labelled[1]]
            if input.labelled
            else []
        ),
        # ["--gpkg", path] with districts, else none
        gpkg=lambda wildcards, output: (
            ["--gpkg", output.gpkg] if "gpkg" in output.keys() else []
        ),
    shell:
        "python -m emb.estimation.area_estimates --run={wildcards.run:q} --maps={input.maps:q}"
        " --indexes {input.indexes:q} --labels {input.labels:q} --classes={input.classes:q}"
        " --settings={params.settings:q} {params.labelled:q} {params.gpkg:q}"
        " --csv={output.csv:q} --png={output.png:q} --sample-size={output.sample_size:q}"
        " --threads={threads} > {log:q} 2>&1"


rule sample_design:
    input:
        unpack(lambda w: samples.sample_size_inputs(config["area_estimates"], w.run)),
        # with n: auto, area_estimates' recommendation (sample_size)
        districts=DISTRICTS,  # the districts file (or the areas file), if any
        maps="results/maps/{run}",
        classes=config["classes"],
    output:
        csv="results/samples/{run}/sample.csv",
        gpkg="results/samples/{run}/sample.gpkg",
        record="results/samples/{run}/sample.json",
    log:
        "logs/sample_design/{run}.log",
    benchmark:
        "benchmarks/sample_design/{run}.tsv"
    conda:
        "../../envs/emb.yaml"
    # two worker processes, each a share of the maps through both passes: 0.63-0.75x the
    # wall time of one process and a reader thread on 2 free cores at 1,000 regions
    # (bench/state_scale.py), the same points
    threads: 2
    resources:
        mem_mb=2000,
        runtime=30,
    params:
        maps=lambda wildcards, input: samples.sample_maps(
            SAMPLE_REGIONS[wildcards.run], input.maps, wildcards.run
        ),
        out_dir=lambda wildcards, output: Path(output.csv).parent,
        settings=AREA_SETTINGS,
        # ["--sample-size", json] with n: auto, else none; each word quoted by :q
        sample_size=lambda wildcards, input: (
            ["--sample-size", input.sample_size]
            if "sample_size" in input.keys()
            else []
        ),
    shell:
        "python -m emb.estimation.sample_design --maps {params.maps:q}"
        " --classes={input.classes:q} --settings={params.settings:q}"
        " {params.sample_size:q} --out-dir={params.out_dir:q}"
        " --threads={threads} > {log:q} 2>&1"
