# Areas, not rasters: config areas: names an areas file; its regions ({area}_{zone}) were
# planned over config collections: at parse time (workflow/rules/common.smk) and joined the
# regions table. Rule areas writes their VRTs (no pixel copies); rule fetch_tiles downloads
# the tiles a collection with a url lacks (its url and workers reach only that rule: how bytes
# are fetched reruns no region). Both run where Snakemake runs: a login node has
# the internet that compute nodes often lack, and writing VRTs takes seconds. TESSERA tiles
# given as geotessera .npy are converted to GeoTIFFs here first, once per tile.
import json

from emb.workflow.area_plan import (
    age_stale_markers,
    fetch_collections,
    fetch_url,
    fetched_markers,
    npy_inputs,
    npy_outputs,
    plan_inputs,
    region_collections,
    tile_folders,
)

# A tile deleted after its fetch: the files, not the marker, say what is there. The folders
# that hold the tiles are rule fetch_tiles' inputs, and a marker whose collection lacks a tile
# is dated back, so the next run fetches it again (and reruns nothing after the fetch).
age_stale_markers(AREAS, config["collections"])


if AREAS:

    localrules:
        areas,
        fetch_tiles,

    rule areas:
        input:
            areas=config["areas"],
            collections=plan_inputs(config["collections"]),
            # ancient: a tile fetched again is the same bytes (checked against the index and
            # the server's digests): the VRTs and every job after them stay as they are
            fetched=[ancient(m) for m in fetched_markers(config["collections"])],
            npy=npy_inputs(AREAS),
        output:
            vrts=AREA_VRTS,
            tessera_tiles=npy_outputs(AREAS),
            table="results/areas/regions.tsv",
        log:
            "logs/areas/areas.log",
        benchmark:
            "benchmarks/areas/areas.tsv"
        conda:
            "../../envs/emb.yaml"
        params:
            # what decides the regions' content only: a new mirror url or download threads
            # must not replan the areas, rewrite the VRTs and rerun everything after them
            collections=lambda wildcards: json.dumps(
                region_collections(config["collections"])
            ),
        shell:
            "python -m emb.areas.build --areas={input.areas:q}"
            " --collections={params.collections:q} --table={output.table:q} > {log:q} 2>&1"

    rule fetch_tiles:
        input:
            areas=config["areas"],
            collections=plan_inputs(config["collections"]),
            folders=lambda wildcards: tile_folders(AREAS, wildcards.source),
        output:
            "results/areas/fetched/{source}.tsv",
        log:
            "logs/areas/fetch_{source}.log",
        benchmark:
            "benchmarks/areas/fetch_{source}.tsv"
        conda:
            "../../envs/emb.yaml"
        resources:
            # how bytes are fetched, not which: resources are no reason to rerun, so another
            # mirror or thread count refetches nothing and reruns nothing after it
            fetch_url=lambda wildcards: fetch_url(
                config["collections"], wildcards.source
            ),
            fetch_workers=config["collections"]["workers"],  # set: the schema gives its default
        params:
            # the source's folder and index: what is fetched, and where to
            collections=lambda wildcards: json.dumps(
                fetch_collections(config["collections"], wildcards.source)
            ),
        shell:
            "python -m emb.areas.fetch --areas={input.areas:q} --source={wildcards.source:q}"
            " --collections={params.collections:q} --url={resources.fetch_url:q}"
            " --workers={resources.fetch_workers:q} --out={output:q} > {log:q} 2>&1"
