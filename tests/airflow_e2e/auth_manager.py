"""Airflow's SimpleAuthManager with per-DAG denials, so the e2e stack has a user who cannot see a DAG.

SimpleAuthManager's roles are global (a viewer reads every DAG); per-DAG rules need another auth manager
(FAB, Keycloak...). This one adds the rule the Partitions page's auth test needs and nothing else: each
user named in `AP_E2E_HIDDEN_DAGS` (`user:dag_a|dag_b;other:dag_c`) is refused every access to those
DAGs; everything else is SimpleAuthManager's decision. The api-server loads it through
`[core] auth_manager = airflow_e2e.auth_manager.DagScopedSimpleAuthManager`.
"""

from __future__ import annotations

import os
from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

HIDDEN_DAGS_ENV = "AP_E2E_HIDDEN_DAGS"


def hidden_dags(username: str) -> set[str]:
    for rule in os.environ.get(HIDDEN_DAGS_ENV, "").split(";"):
        user, _, dags = rule.partition(":")
        if user == username:
            return set(filter(None, dags.split("|")))
    return set()


class DagScopedSimpleAuthManager(SimpleAuthManager):
    """SimpleAuthManager, except that `AP_E2E_HIDDEN_DAGS` hides DAGs from named users."""

    def is_authorized_dag(
        self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None
    ) -> bool:
        if details is not None and details.id in hidden_dags(user.get_name()):
            return False
        return bool(
            super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
        )
