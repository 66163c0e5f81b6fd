"""The rules as Snakemake parses them (not a dry run: no job is planned): what the report files
where, made by one helper (``report_file`` in workflow/rules/common.smk), and the launched
shape that gpu_check vouches for and train gets, stated once in workflow/rules/train.smk."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import emb

pytestmark = pytest.mark.slow  # parses the whole workflow (~13 s on 2 busy cores)

REPO = Path(emb.__file__).resolve().parents[2]  # the checkout under test (a copy's, if first)
LAUNCH = {"nproc_per_node": 2, "threads": 3}  # not the schema's 1 and 1: the config must reach both

# Prints every report() flag and the two rules' launched resources as JSON.
SCRIPT = r"""
import json, sys
from pathlib import Path
from snakemake.api import SnakemakeApi
from snakemake.resources import Resources
from snakemake.settings.types import ConfigSettings, OutputSettings, ResourceSettings

snakefile, workdir, launch = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
with SnakemakeApi(OutputSettings(quiet={"all"})) as api:
    workflow = api.workflow(
        resource_settings=ResourceSettings(cores=16, default_resources=Resources.parse(
            ["slurm_account=project_1", "slurm_partition=small"],  # as a profile gives them
            allow_expressions=True, defaults="bare")),
        config_settings=ConfigSettings(config={"launch": launch}),
        snakefile=snakefile, workdir=workdir,
    )._workflow
    out = {"report": [], "resources": {}, "unmarked": [], "account": {}}
    for rule in workflow.rules:
        for name, item in rule.output._allitems():
            flag = item.flags.get("report")
            if flag:
                out["report"].append({
                    "rule": rule.name, "output": name or "",
                    "caption": Path(flag.caption.get_path_or_uri(True)).resolve().name,
                    "category": getattr(flag.category, "__name__", flag.category),
                    "subcategory": flag.subcategory,
                    "labels": getattr(flag.labels, "__name__", flag.labels),
                    "patterns": list(flag.patterns),
                })
        if rule.name in ("gpu_check", "train"):
            values = {k: v.value for k, v in rule.resources.items() if not v.is_evaluable()}
            out["resources"][rule.name] = {
                "threads": values["_cores"],
                **{k: v for k, v in values.items() if k[0] != "_"},
            }
        if rule.name == "shards":  # its functions run for every job
            items = [*rule.input._allitems(), *rule.params._allitems()]
            funcs = {name: getattr(getattr(item, "_file", item), "callable", item)
                     for name, item in items}
            funcs.update({f"resources.{k}": r._evaluator for k, r in rule.resources.items()
                          if r.is_evaluable() and not k.startswith("_")
                          and r._evaluator.__module__.startswith("emb")})
            out["account"][rule.name] = [
                "per job" if r.is_evaluable() else r.value
                for r in (rule.resources["slurm_account"], rule.resources["slurm_partition"])]
            out["unmarked"] += [f"{rule.name} {name}" for name, f in funcs.items()
                                if callable(f) and not hasattr(f, "_overwrite_params")]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def parsed(tmp_path_factory: pytest.TempPathFactory) -> dict:
    work = tmp_path_factory.mktemp("layout")
    shutil.copytree(REPO / "config", work / "config")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(REPO / "Snakefile"), str(work), json.dumps(LAUNCH)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_file(rule: str, output: str, caption: str, figure: str) -> dict:
    return {"rule": rule, "output": output, "caption": caption, "category": "Runs",
            "subcategory": "{run}", "labels": {"run": "{run}", "figure": figure},
            "patterns": []}  # fmt: skip


def other_file(rule: str, output: str, caption: str, category: str, labels: dict) -> dict:
    return {"rule": rule, "output": output, "caption": caption, "category": category,
            "subcategory": None, "labels": labels, "patterns": []}  # fmt: skip


# The report as it looked before the helper (issue 43): section, subsection, labels, caption.
REPORT = [
    run_file("evaluate", "per_class", "per_class.rst", "per-class scores (CSV)"),
    run_file("evaluate", "confusion_l1", "confusion.rst", "confusion L1"),
    run_file("evaluate", "confusion_l2", "confusion.rst", "confusion L2"),
    run_file("evaluate", "confusion_l3", "confusion.rst", "confusion L3"),
    run_file("evaluate", "iou", "iou.rst", "per-class IoU"),
    {"rule": "predict", "output": "maps", "caption": "map.rst", "category": "map_category",
     "subcategory": "{run}", "labels": "map_labels", "patterns": ["{region}.png"]},
    {**run_file("area_estimates", "csv", "area_estimates.rst", "areas per class (CSV)"),
     "category": "Crop areas"},
    {**run_file("area_estimates", "png", "area_estimates.rst", "mapped vs estimated area"),
     "category": "Crop areas"},
    other_file("summary", "csv", "summary.rst", "Summary", {"figure": "table (CSV)"}),
    other_file("summary", "html", "summary.rst", "Summary", {"figure": "table"}),
    other_file("summary", "png", "summary_figure.rst", "Summary",
               {"figure": "all runs side by side"}),
    other_file("summary", "pairs", "pairs.rst", "Summary",
               {"figure": "paired comparisons (CSV)"}),
    other_file("summary", "pairs_png", "pairs_figure.rst", "Summary",
               {"figure": "paired differences (forest plot)"}),
    other_file("summary", "provenance", "provenance.rst", "Provenance",
               {"figure": "code, libraries, config and data of each run"}),
    run_file("curves", "", "curves.rst", "training curves"),
    other_file("data_report", "png", "data.rst", "Data",
               {"source": "{source}", "figure": "tiles and classes"}),
    other_file("data_report", "html", "data.rst", "Data",
               {"source": "{source}", "figure": "tables"}),
]  # fmt: skip


def test_the_report_files_every_figure_where_it_did(parsed: dict) -> None:
    assert parsed["report"] == REPORT
    captions = {entry["caption"] for entry in parsed["report"]}
    assert all((REPO / "workflow/report" / caption).is_file() for caption in captions)


def test_gpu_check_and_train_get_one_launched_shape_from_the_config(parsed: dict) -> None:
    check, train = parsed["resources"]["gpu_check"], parsed["resources"]["train"]
    shape = {"threads": 6, "nodes": 1, "tasks_per_node": 2, "cpus_per_task": 3,
             "gpus_per_node": 0}  # fmt: skip
    for resources in (check, train):
        assert {key: resources[key] for key in shape} == shape
    assert (check["mem_mb"], check["runtime"]) != (train["mem_mb"], train["runtime"])


def test_the_per_region_rules_functions_carry_their_parameters(parsed: dict) -> None:
    """Read once while parsing (emb.workflow.signatures), not by inspect.signature per job."""
    assert parsed["unmarked"] == []


def test_the_per_region_rules_get_the_profiles_account_and_partition_as_plain_values(
    parsed: dict,
) -> None:
    """Found once (emb.workflow.profile.fixed_strings), not evaluated for every job."""
    plain = ["project_1", "small"]
    assert parsed["account"] == {"shards": plain}
