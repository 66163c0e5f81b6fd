"""The group jobs a dry run lists, summed as Snakemake submits them (emb.workflow.cluster_fit): what
``snakemake -n`` shows of a cluster profile's groups, checked against the node sizes each
listed job carries (resources node_cores, node_mem_mb, max_runtime)."""

from __future__ import annotations

import re

from emb.workflow.cluster_fit import Node, Request, group_request

FIELD = re.compile(r"^\s+(input|output|resources|threads): (.*)$", re.M)


def resources_of(line: str) -> dict[str, str]:
    """``resources: a=1, b=x`` as a dict (values as listed)."""
    return dict(item.split("=", 1) for item in line.split(", ") if "=" in item)


def listed_groups(stdout: str) -> list[tuple[str, list[list[Request]], Node]]:
    """Each "Group job" of a dry run: its name, its members' requests level by level (a
    member that reads another member's output runs after it), and its node."""
    found = []
    for chunk in re.split(r"^.*Group job ", stdout, flags=re.M)[1:]:
        name = chunk.split()[0]
        members = []
        for block in re.split(r"\n(?=\s+rule \w+:)", chunk)[1:]:
            fields = dict(FIELD.findall(block.split("\nShell command")[0]))
            res = resources_of(fields["resources"])
            members.append({
                "inputs": set(fields.get("input", "").split(", ")),
                "outputs": set(fields.get("output", "").split(", ")),
                "request": Request(int(fields.get("threads", 1)), int(res["mem_mb"]),
                                   int(res["runtime"])),
                "node": Node(res["slurm_partition"], int(res["node_cores"]),
                             int(res["node_mem_mb"]),
                             float(res["max_runtime"]) if "max_runtime" in res else None),
            })  # fmt: skip
        levels, left = [], members
        while left:
            made = set().union(*(m["outputs"] for m in left))
            level = [m for m in left if not m["inputs"] & made] or left
            levels.append([m["request"] for m in level])
            left = [m for m in left if m not in level]
        found.append((name, levels, members[0]["node"]))
    return found


def group_requests(stdout: str) -> list[tuple[str, Request, Node]]:
    """Each listed group's summed request and its node."""
    return [(name, group_request(levels), node) for name, levels, node in listed_groups(stdout)]
