"""Retries that only retry what can succeed.

Snakemake resubmits a failed job (``retries:`` in the profiles), and on a cluster every
resubmission waits in the queue for a whole GPU node. Only a deliberate stop (exit 75: a
signal or the job's deadline, with a checkpoint to resume from) can succeed on a retry; a bad
config (2), a diverged run (3) or any other failure fails the same way again. So the first
attempt that fails for such a reason leaves a record, and a later attempt of the same Snakemake
run finds it and ends within seconds with the original exit code, before starting anything.
Attempt 1 (a new Snakemake run, after the user fixed the cause) removes a stale record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from emb.cluster.supervise import EX_TEMPFAIL
from emb.io import json_text


def earlier_failure(record: Path, attempt: int) -> tuple[int, str] | None:
    """(exit code, message) of an earlier attempt's failure no retry can fix, or None to run."""
    if attempt <= 1:
        record.unlink(missing_ok=True)
        errors_file(record).unlink(missing_ok=True)
        return None
    try:
        info = json.loads(record.read_text())
        code, first, when = int(info["code"]), int(info["attempt"]), str(info["when"])
        errors = [str(line) for line in info.get("errors", [])]
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        return 1, f"{record}: unreadable failure record ({err}); delete it to run again"
    return code or 1, (
        f"attempt {attempt}: attempt {first} of this job failed with exit code {code} at "
        f"{when} ({'; '.join(errors) if errors else 'its error is in its SLURM log'}); "
        f"only a stop with a checkpoint (exit "
        f"{EX_TEMPFAIL}) is worth a retry, so nothing is started. Fix the cause and run "
        f"Snakemake again (that removes {record})"
    )


def record_failure(record: Path, attempt: int, code: int) -> None:
    """Leave a record for later attempts when ``code`` is a failure a retry cannot fix."""
    if code in (0, EX_TEMPFAIL):
        return
    record.parent.mkdir(parents=True, exist_ok=True)
    when = time.strftime("%Y-%m-%dT%H:%M:%S")
    errors = _last_lines(errors_file(record), 3)
    info = {"attempt": attempt, "code": code, "when": when, "errors": errors}
    record.write_text(json_text(info) + "\n")


def errors_file(record: Path) -> Path:
    """Where the command's ERROR lines are copied (``EMB_ERROR_FILE``, emb.stage_runner)."""
    return record.with_name(record.name + ".errors")


def _last_lines(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    return [line.strip() for line in lines if line.strip()][-n:]
