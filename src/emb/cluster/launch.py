"""Start a training (or per-node) command: one process, torchrun on one node, or srun across nodes.

One launcher for every place the ``train`` rule runs, so that N GPUs never each walk the whole
data set because training was started the wrong way:

- one process: ``python -m MODULE ARGS`` (one node, one process);
- one node, N processes: ``torchrun --standalone --nproc_per_node=N -m MODULE ARGS``;
- inside a SLURM allocation (``--srun``): ``srun`` starts one task per node, each task runs the
  node command above; across several nodes (or with ``--rendezvous c10d``) torchrun meets the
  other nodes through a c10d rendezvous on the first node of the allocation (its ``NodeAddr``);
- nodes started without SLURM (``--endpoint HOST:PORT``, the same ``--run-id`` on each): the
  same torchrun, run here; tests start two such nodes on one machine.

Across nodes the rendezvous waits ``--rdzv-timeout`` seconds (600) for every node, and each
node's launcher beats in an HTTP store on the first node (:mod:`emb.cluster.watch`): when the node
command fails, the launcher names the nodes that stopped beating (exit 75: the retry resumes
from ``last.pt``) or never came. Its line is the last: torchrun's own traceback is held back
and cut to its exception (:mod:`emb.cluster.torchrun_output`). The endpoint is checked before
torchrun starts (a port in 1-65535, a host that resolves here): else one line, exit 2.

Why ``srun`` even on one node: Snakemake's SLURM plugin runs a rule with an ``mpi`` resource in
the batch step, and ``sbatch --signal=USR1@N`` (without ``B:``) signals job steps only. The
``srun`` step is what SLURM's warning signal reaches; the batch shell and Snakemake do not get it
(``B:`` would kill the batch shell, and with it the job).

Signals: each node command runs under :func:`emb.cluster.supervise.supervise` (``--supervise``
inside an srun task, directly otherwise): SIGUSR1 is ignored in the command and forwarded to its
whole process tree, SIGTERM/SIGINT to the command itself. The trainer then checkpoints at its
next step and exits 75; the launcher exits 75 when the command failed after writing
``--checkpoint`` during this launch (stopped early, resumable), so Snakemake's retry resumes it.
Nothing outlives the launcher: when torchrun's agent dies (SIGKILL included), the workers it
left are killed at once and the launcher exits only after they are gone (supervise).

GPUs: more processes per node than the node's visible GPUs is refused in one line (exit 2)
before torchrun starts, where the node command runs (here, or in each srun task / container):
rank N would otherwise get a ``cuda:N`` that does not exist and hang. ``train``, ``evaluate``
and ``predict`` all start through here. On a machine without GPUs the processes share the
CPUs and any number is allowed.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from emb.cluster.gpu_check import too_many_processes
from emb.cluster.retries import earlier_failure, errors_file, record_failure
from emb.cluster.slurm import SlurmError, first_node, job_end_time, node_address
from emb.cluster.supervise import EX_TEMPFAIL, LaunchError, resumable_exit, supervise
from emb.cluster.torchrun_output import TorchrunOutput
from emb.config_schema import config_default, config_option
from emb.stage_runner import ERROR_FILE_ENV

RENDEZVOUS = ("auto", "standalone", "c10d")
LAUNCH_ID_ENV = "EMB_LAUNCH_ID"  # unique per launch: a retry's ranks never meet an earlier one's
C10D_BASE_PORT = 29400
MAX_PORT = 65535
RDZV_TIMEOUT_S = 600  # a node waits this long for the others (torchrun's join_timeout default)
NPROC_ENV = "EMB_NPROC_PER_NODE"  # processes per node, for the GPU check in each srun task


@dataclass(frozen=True)
class Launch:
    """How to start one command on ``nodes`` x ``nproc_per_node`` processes."""

    nodes: int = 1
    # config launch.nproc_per_node and launch.threads: the schema's defaults, read when made
    nproc_per_node: int = field(
        default_factory=lambda: int(config_default("launch.nproc_per_node"))
    )
    # CPU threads per process (OMP_NUM_THREADS, srun's cpus per task)
    threads: int = field(default_factory=lambda: int(config_default("launch.threads")))
    srun: bool = False  # wrap in srun, one task per node (inside a SLURM allocation)
    rendezvous: str = "auto"  # auto: standalone on one node, c10d across nodes
    per_node: bool = False  # one plain process per node, no torchrun (checks)
    container: str = ""  # image run by apptainer/singularity (inside each srun task)
    container_args: str = ""
    container_runtime: str = "apptainer"
    env: tuple[str, ...] = field(default=())  # NAME=VALUE defaults, $VARS expanded at launch
    endpoint: str = ""  # HOST:PORT where nodes started without srun meet (c10d)
    hosts_endpoint: bool | None = None  # this node hosts the rendezvous (None: by host name)
    rdzv_timeout_s: int = RDZV_TIMEOUT_S  # how long a node waits for the others to arrive

    def __post_init__(self) -> None:
        for name in ("nodes", "nproc_per_node", "threads"):
            if getattr(self, name) < 1:
                raise LaunchError(f"{name} must be >= 1, found {getattr(self, name)}")
        if self.rendezvous not in RENDEZVOUS:
            raise LaunchError(f"rendezvous must be one of {RENDEZVOUS}, found {self.rendezvous!r}")
        if self.nodes > 1 and not (self.srun or self.endpoint):
            raise LaunchError(
                f"{self.nodes} nodes need srun (a SLURM allocation) or --endpoint HOST:PORT "
                "(each node started by hand); found neither"
            )
        if self.endpoint and self.srun:
            raise LaunchError("--endpoint is for nodes started without srun; found both")
        if self.endpoint:
            split_endpoint(self.endpoint)
        if self.rdzv_timeout_s < 1:
            raise LaunchError(f"rdzv_timeout_s must be >= 1, found {self.rdzv_timeout_s}")
        for item in self.env:
            if "=" not in item or not item.split("=", 1)[0].isidentifier():
                raise LaunchError(f"env entry {item!r}: expected NAME=VALUE")

    @property
    def c10d(self) -> bool:
        return self.rendezvous == "c10d" or (
            self.rendezvous == "auto" and (self.nodes > 1 or bool(self.endpoint))
        )


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (an IPv6 host in brackets); a port outside 1-65535 is
    refused here, before torchrun or the heartbeat thread meet it."""
    found = re.fullmatch(r"([\w.:\[\]-]+):(\d+)", endpoint)
    if not found:
        raise LaunchError(f"endpoint: expected HOST:PORT, found {endpoint!r}")
    port = int(found.group(2))
    if not 1 <= port <= MAX_PORT:
        raise LaunchError(f"endpoint {endpoint}: expected a port in 1-{MAX_PORT}, found {port}")
    return found.group(1).strip("[]"), port


def check_endpoint_resolves(endpoint: str) -> None:
    """Refuse an endpoint whose host does not resolve here: torchrun would retry it for its
    whole read timeout, then fail in words about waiting."""
    host, port = split_endpoint(endpoint)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as err:  # socket.gaierror; UnicodeError: an invalid label
        why = getattr(err, "strerror", None) or str(err)
        raise LaunchError(
            f"endpoint {endpoint}: host {host!r} does not resolve on this node ({why}); "
            "expected the first node's host name or address"
        ) from None


def node_command(
    launch: Launch, module: str, args: list[str], endpoint: str, run_id: str
) -> list[str]:
    """What runs on each node: ``python -m`` or torchrun (standalone or c10d at ``endpoint``)."""
    if launch.per_node or (launch.nproc_per_node == 1 and not launch.c10d):
        return ["python", "-m", module, *args]
    if launch.c10d:
        # join_timeout: the whole rendezvous; read_timeout: a node reaching the endpoint's
        # store before the first node hosts it keeps trying that long (torch's default: 60 s)
        conf = f"join_timeout={launch.rdzv_timeout_s},read_timeout={launch.rdzv_timeout_s}"
        if launch.hosts_endpoint is not None:  # needed where every host matches the endpoint
            conf += f",is_host={int(launch.hosts_endpoint)}"
        rdzv = [f"--nnodes={launch.nodes}", "--rdzv_backend=c10d",
                f"--rdzv_endpoint={endpoint}", f"--rdzv_id={run_id}",
                f"--rdzv_conf={conf}"]  # fmt: skip
    else:
        rdzv = ["--standalone", "--nnodes=1"]
    return ["torchrun", *rdzv, f"--nproc_per_node={launch.nproc_per_node}",
            "--max_restarts=0", "-m", module, *args]  # fmt: skip


def srun_command(launch: Launch, node: list[str]) -> list[str]:
    """``srun`` one task per node, each running ``node`` (in the container, if any)."""
    cpus = launch.threads * launch.nproc_per_node
    srun = ["srun", f"--nodes={launch.nodes}", f"--ntasks={launch.nodes}",
            "--ntasks-per-node=1", f"--cpus-per-task={cpus}", "--kill-on-bad-exit=1"]  # fmt: skip
    return [*srun, *contained(launch, node)]


def contained(launch: Launch, node: list[str]) -> list[str]:
    """``node`` under the launcher's supervision, inside ``launch.container`` when one is set."""
    supervised = ["python", "-m", "emb.cluster.launch", "--supervise"]
    if launch.nodes > 1 and not launch.per_node:  # each task watches the other nodes
        supervised += [f"--nodes={launch.nodes}", f"--rdzv-timeout={launch.rdzv_timeout_s}"]
    supervised += ["--", *node]
    if not launch.container:
        return supervised
    runtime = [launch.container_runtime, "exec", *shlex.split(launch.container_args)]
    return [*runtime, launch.container, *supervised]


def command(launch: Launch, module: str, args: list[str], endpoint: str, run_id: str) -> list[str]:
    """The full command line for ``launch``."""
    node = node_command(launch, module, args, endpoint, run_id)
    if launch.srun:
        return srun_command(launch, node)
    return contained(launch, node) if launch.container else node


def environment(launch: Launch, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus the launch's defaults (``$VARS`` expanded against ``base``; set ones win)."""
    env = dict(base)
    env.setdefault("OMP_NUM_THREADS", str(launch.threads))
    for item in launch.env:
        name, value = item.split("=", 1)
        if name not in env:
            env[name] = expand(value, env)
    return env


def expand(value: str, env: Mapping[str, str]) -> str:
    """``$NAME`` / ``${NAME}`` from ``env``; an unset name is an error, not an empty string."""

    def sub(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        if name not in env:
            raise LaunchError(f"env value {value!r}: ${name} is not set")
        return env[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", sub, value)


def visible_gpus() -> int:
    """GPUs this process sees (CUDA and ROCm builds alike); torch is imported only here."""
    import torch

    return torch.cuda.device_count()


def check_processes_fit(nproc: int, gpus: int) -> None:
    """Refuse more processes per node than visible GPUs on a GPU machine."""
    if gpus and nproc > gpus:
        raise LaunchError(too_many_processes(nproc, gpus))


def check_node(nproc: int) -> None:
    """The GPU check where the node command runs (one process needs none: it takes cuda:0)."""
    if nproc > 1:
        check_processes_fit(nproc, visible_gpus())


def c10d_port(job_id: str | None) -> int:
    """A port per SLURM job, so two jobs sharing a node do not meet in one rendezvous."""
    return C10D_BASE_PORT + (int(job_id) % 10000 if job_id and job_id.isdigit() else 0)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="python -m emb.cluster.launch [options] -- MODULE [ARGS...]",
    )
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument(
        "--nproc-per-node", type=int,
        **config_option("launch.nproc_per_node", "processes (GPUs) per node"),
    )  # fmt: skip
    parser.add_argument(
        "--threads", type=int, **config_option("launch.threads", "CPU threads per process")
    )
    parser.add_argument("--srun", action="store_true", help="one srun task per node (SLURM)")
    parser.add_argument("--rendezvous", choices=RENDEZVOUS, default="auto")
    parser.add_argument(
        "--endpoint", default="", help="HOST:PORT of the first node, for nodes started without srun"
    )
    parser.add_argument(
        "--hosts-endpoint",
        choices=("yes", "no"),
        help="this node hosts the rendezvous (default: the endpoint's host)",
    )
    parser.add_argument("--node-name", default="", help="this node in messages (default: host)")
    parser.add_argument("--run-id", default="", help="with --endpoint: the same on every node")
    parser.add_argument("--rdzv-timeout", type=int, default=RDZV_TIMEOUT_S,
                        help="seconds a node waits for the others at the rendezvous")  # fmt: skip
    parser.add_argument("--per-node", action="store_true", help="one plain process per node")
    parser.add_argument("--container", default="", help="image for each srun task")
    parser.add_argument("--container-args", default="", help="apptainer exec options")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="environment default; $VARS expand at launch")  # fmt: skip
    parser.add_argument("--checkpoint", type=Path, help="written by a resumable stop: exit 75")
    parser.add_argument("--attempt", type=int, default=1, help="Snakemake's attempt number")
    parser.add_argument(
        "--failure-record", type=Path, help="left by a failure no retry can fix (see retries)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command, run nothing")
    parser.add_argument("--supervise", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing the module (or, with --supervise, the command) after --")
    return args


def prepare(
    args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[Launch, list[str], dict[str, str]]:
    """The launch, command and environment for ``args``; SLURM is asked only inside a job."""
    runtime = "apptainer" if shutil.which("apptainer") else "singularity"
    launch = Launch(args.nodes, args.nproc_per_node, args.threads, args.srun, args.rendezvous,
                    args.per_node, args.container, args.container_args, runtime,
                    tuple(args.env), args.endpoint,
                    None if args.hosts_endpoint is None else args.hosts_endpoint == "yes",
                    args.rdzv_timeout)  # fmt: skip
    if args.container and not Path(args.container).is_file():
        raise LaunchError(f"container image {args.container} does not exist")
    job_id = environ.get("SLURM_JOB_ID")
    env = dict(environ)
    if job_id and "SLURM_JOB_END_TIME" not in env:  # the trainer's deadline, even in a container
        end = job_end_time(job_id)
        if end is not None:
            env["SLURM_JOB_END_TIME"] = str(end)
    endpoint = launch.endpoint
    if launch.c10d and not launch.per_node and not endpoint:
        host = node_address(first_node(job_id)) if job_id else socket.gethostname()
        endpoint = f"{host}:{c10d_port(job_id)}"
    if launch.c10d and not launch.per_node:
        check_endpoint_resolves(endpoint)
    run_id = args.run_id or job_id or "local"
    cmd = command(launch, args.command[0], args.command[1:], endpoint, run_id)
    env = environment(launch, env)
    env[LAUNCH_ID_ENV] = uuid.uuid4().hex
    env[NPROC_ENV] = str(1 if launch.per_node else launch.nproc_per_node)
    return launch, cmd, env


def run_node(cmd: list[str], env: Mapping[str, str] | None, watch: dict | None) -> int:
    """``cmd`` under supervision. Across nodes, a failure names the nodes that were lost or
    never came (:func:`verdict`), as the last line: torchrun's own traceback is held back until
    then and, where that line says why torchrun failed, shortened to its exception
    (:mod:`emb.cluster.torchrun_output`)."""
    output = TorchrunOutput(sys.stderr.buffer) if Path(cmd[0]).name == "torchrun" else None
    line = None
    try:
        code, line = verdict(cmd, env, watch, output)
    finally:
        sys.stderr.flush()
        if output is not None:
            output.release(explained=line is not None)
    if line is not None:
        print(line, file=sys.stderr, flush=True)
    return code


def verdict(
    cmd: list[str], env: Mapping[str, str] | None, watch: dict | None,
    output: TorchrunOutput | None,
) -> tuple[int, str | None]:  # fmt: skip
    """(exit code, the launcher's line on why it failed, or None). A node lost after all had
    come is worth a retry (exit 75: nothing is wrong with the run, and its ``last.pt`` resumes
    it)."""
    if watch is None:
        return supervise(cmd, env, output), None
    from emb.cluster.watch import NodeWatch

    nodes = NodeWatch(**watch)
    try:
        code = supervise(cmd, env, output)
        lost, started = nodes.lost() if code != 0 else ([], False)
    finally:
        nodes.close()
    if not lost:
        return code, None
    name = watch["name"]
    if not started:
        why = f"waited for {'; '.join(lost)} (--rdzv-timeout)"
        return code, f"error: {name}: {why}: not all {watch['nodes']} nodes started; exit {code}"
    return EX_TEMPFAIL, (f"error: {name}: lost {'; '.join(lost)}; this node stops too (exit "
                         f"{code}); a retry resumes from the last checkpoint")  # fmt: skip


def node_name(given: str = "") -> str:
    """This node's name in messages: SLURM's node name, else the host name."""
    return given or os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def watch_options(args: argparse.Namespace, launch: Launch, cmd: list[str]) -> dict | None:
    """The heartbeat settings of a multi-node launch whose node command runs here."""
    endpoint = next((a.split("=", 1)[1] for a in cmd if a.startswith("--rdzv_endpoint=")), "")
    if launch.nodes < 2 or launch.per_node or not endpoint:
        return None
    hosts = launch.hosts_endpoint
    if hosts is None:  # in SLURM, the first node of the allocation (that is where it points)
        slurm = os.environ.get("SLURM_NODEID")
        host = endpoint.rsplit(":", 1)[0]
        hosts = slurm == "0" if slurm is not None else host in (socket.gethostname(), "localhost")
    return {"endpoint": endpoint, "name": node_name(args.node_name), "nodes": launch.nodes,
            "hosts": hosts, "connect_s": float(launch.rdzv_timeout_s)}  # fmt: skip


def supervised_main(args: argparse.Namespace) -> None:
    """Inside an srun task (or container): check the GPUs, run the node command (watched
    across nodes)."""
    nproc = int(os.environ.get(NPROC_ENV, "1"))
    try:
        check_node(nproc)
    except LaunchError as err:
        print(f"error: {node_name(args.node_name)}: {err}", file=sys.stderr)
        sys.exit(2)
    launch = Launch(args.nodes, srun=True, rdzv_timeout_s=args.rdzv_timeout)
    sys.exit(run_node(args.command, None, watch_options(args, launch, args.command)))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.supervise:
        supervised_main(args)
    started = time.time()
    record = args.failure_record
    earlier = earlier_failure(record, args.attempt) if record and not args.dry_run else None
    if earlier is not None:
        print(f"error: {earlier[1]}", file=sys.stderr)
        sys.exit(earlier[0])
    try:
        launch, cmd, env = prepare(args, os.environ)
        watch = None
        if not (args.srun or args.container or args.per_node):  # the node command runs here
            check_node(args.nproc_per_node)
            watch = watch_options(args, launch, cmd)
        if record:
            record.parent.mkdir(parents=True, exist_ok=True)
            env[ERROR_FILE_ENV] = str(errors_file(record))  # why it failed, for a retry
        print("launch:", shlex.join(cmd), flush=True)
        if args.dry_run:
            return
        code = resumable_exit(run_node(cmd, env, watch), args.checkpoint, started)
    except (LaunchError, SlurmError) as err:
        print(f"error: {err}", file=sys.stderr)
        code = 2
    if record:
        record_failure(record, args.attempt, code)
    if code == EX_TEMPFAIL:
        print(f"launch: stopped early with a checkpoint ({args.checkpoint}); re-run resumes")
    sys.exit(code)


if __name__ == "__main__":
    main()
