"""`VerifyOperator(deep=...)`: a templated field; deep recomputes every partition's rows from its files
where a certificate would otherwise stand for them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_operators import context, make_spec

from airflow_partitions.exceptions import OrchestrationError
from airflow_partitions.refresh import refresh_dataset

pytestmark = pytest.mark.airflow


def test_verify_operator_deep_is_templated(tmp_path: Path) -> None:
    from airflow_partitions.operators import VerifyOperator

    spec = make_spec(tmp_path)
    refresh_dataset(spec, "sales", strategy="arrow")
    assert "deep" in VerifyOperator.template_fields

    shallow = VerifyOperator(task_id="verify", spec_path=spec, dataset="sales").execute(context())
    assert shallow["ok"]
    assert shallow["deep"] is False
    assert shallow["checked_by"] == {"certificate": 6, "recomputed": 0}, "certificates stand for the files"

    templated = VerifyOperator(task_id="verify", spec_path=spec, dataset="sales", deep="{{ params.deep }}")
    ctx = context(deep=True)
    templated.render_template_fields(ctx)
    assert templated.deep == "True"
    deep = templated.execute(ctx)
    assert deep["ok"]
    assert deep["deep"] is True
    assert deep["checked_by"] == {"certificate": 0, "recomputed": 6}, "every partition's files are read"

    with pytest.raises(OrchestrationError, match="deep must be true or false, got 'sometimes'"):
        VerifyOperator(task_id="verify", spec_path=spec, dataset="sales", deep="sometimes").execute(context())
