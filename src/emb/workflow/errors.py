"""What the parse-time checks raise for a user's mistake: each one line naming the file, the key
and the fix. The rules turn them into Snakemake's ``WorkflowError``: the line, no traceback."""

from __future__ import annotations

from emb.areas import AreasError
from emb.evaluation.windows import PredictSettingsError
from emb.prep.regions import RegionsError
from emb.prep.tiles import SplitBlocksError, TilingError
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
