"""emb: satellite embeddings + CDL labels -> trained crop-type segmentation models."""

from snakemake.utils import min_version

min_version("8.20")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/areas.smk"
include: "workflow/rules/cluster.smk"
include: "workflow/rules/demo.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/stats.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/area_estimates.smk"
include: "workflow/rules/report.smk"


# Bookkeeping that takes seconds runs where Snakemake runs, never as its own cluster job.
localrules:
    regions_table,
    train_config,
    manifest,
    summary,
    curves,
    data_report,


rule all:
    default_target: True
    input:
        "results/summary.csv",
        "results/summary.png",
        report_targets(),
