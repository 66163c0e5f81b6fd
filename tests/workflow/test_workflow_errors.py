"""A user's mistake found while the workflow parses reaches the user as Snakemake's
WorkflowError, its one line and no traceback into emb (emb.workflow.errors.as_workflow_error)."""

from __future__ import annotations

import pytest
from snakemake.exceptions import WorkflowError

from emb.prep.regions import RegionsError
from emb.workflow.errors import as_workflow_error


def test_a_user_error_becomes_a_workflow_error_with_its_line_and_no_context() -> None:
    with pytest.raises(WorkflowError) as err, as_workflow_error():
        raise RegionsError("regions.tsv: row 2 (region 'b'), column 'aef': file not found: x.tif")
    assert str(err.value) == "regions.tsv: row 2 (region 'b'), column 'aef': file not found: x.tif"
    assert err.value.__suppress_context__  # Snakemake prints no "during handling" chain


def test_the_errors_caught_and_a_prefix_can_be_given() -> None:
    prefix = "regions table t.tsv: "
    with pytest.raises(WorkflowError, match=r"^regions table t\.tsv: no such file$"), \
            as_workflow_error((ValueError, OSError), prefix):  # fmt: skip
        raise OSError("no such file")


def test_a_programming_error_is_not_dressed_as_a_users_mistake() -> None:
    with pytest.raises(KeyError), as_workflow_error():
        raise KeyError("tiles")
