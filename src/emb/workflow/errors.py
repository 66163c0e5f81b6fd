"""What the parse-time checks raise for a user's mistake: each one line naming the file, the key
and the fix. The rules turn them into Snakemake's ``WorkflowError`` (:func:`as_workflow_error`):
the line, no traceback."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from types import TracebackType

from snakemake.exceptions import WorkflowError

from emb.areas import AreasError
from emb.evaluation.predict_spec import PredictSettingsError
from emb.prep.regions import RegionsError
from emb.prep.spatial_split import SplitBlocksError, TilingError
from emb.training.run_config import ConfigError
from emb.workflow.profile import ProfileError

USER_ERRORS = (
    AreasError,
    ConfigError,
    PredictSettingsError,
    ProfileError,
    RegionsError,
    SplitBlocksError,
    TilingError,
)


@dataclass(frozen=True)
class _AsWorkflowError:
    errors: tuple[type[Exception], ...]
    prefix: str

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(error, self.errors):
            raise WorkflowError(f"{self.prefix}{error}") from None


def as_workflow_error(
    errors: tuple[type[Exception], ...] = USER_ERRORS, prefix: str = ""
) -> AbstractContextManager[None]:
    """``errors`` raised inside, as the ``WorkflowError`` Snakemake prints as its message alone
    (``prefix`` before it): a user's mistake is one line, not a traceback into emb. (A class,
    not a generator: Snakemake lists every frame the error passed, and a generator adds two.)"""
    return _AsWorkflowError(errors, prefix)
