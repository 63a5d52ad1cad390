"""The Partitions page in a real browser (Debian's chromium, headless, through chromedriver) against the
session's real Airflow stack, and its JSON API under Airflow's auth.

The `ui_sales` dataset has two partitions. US is refreshed first; EU's directory is then taken by a plain
file, so the refresh DAG's EU task fails. The page must show EU failed (with the error) and US fresh;
after the obstacle is gone, selecting EU and pressing "Refresh selected" triggers a run that refreshes
only EU, and the page shows it fresh. The screenshot in the README is taken here.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from airflow_e2e.shared import UI_DAG_ID, UI_DATASET
from airflow_e2e.stack import AirflowStack

from airflow_partitions.cli.backfill import AirflowApiClient
from airflow_partitions.cli.main import main as cli_main

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.postgres,
    pytest.mark.browser,
    pytest.mark.timeout(900),
]

REPO_ROOT = Path(__file__).resolve().parent.parent
SCREENSHOT = REPO_ROOT / "docs" / "images" / "partitions-page.png"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
EU, US = "region=EU", "region=US"
COOKIE_NAME = "_token"  # airflow.api_fastapi.auth.managers.base_auth_manager.COOKIE_NAME_JWT_TOKEN


def token(stack: AirflowStack, user: str) -> str:
    response = requests.post(
        f"{stack.api_url}/auth/token",
        json={"username": user, "password": stack.passwords[user]},
        timeout=30,
    )
    response.raise_for_status()
    return str(response.json()["access_token"])


def api(stack: AirflowStack, user: str, method: str, path: str, **kwargs: Any) -> requests.Response:
    return requests.request(
        method,
        f"{stack.api_url}/partitions/api/{path}",
        headers={"Authorization": f"Bearer {token(stack, user)}"},
        timeout=120,
        **kwargs,
    )


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver

    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: `make system-deps` installs chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,720"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()


def row_states(driver: Any) -> dict[str, str]:
    # Read in one script: the page re-renders its rows while it polls, so element handles go stale.
    rows = driver.execute_script(
        "return Array.from(document.querySelectorAll('#rows tr'))"
        ".map((row) => [row.dataset.keyPath, row.dataset.state]);"
    )
    return {str(key_path): str(state) for key_path, state in rows}


def wait_for_states(driver: Any, stack: AirflowStack, expected: dict[str, str], timeout: float) -> None:
    """Wait until the page shows `expected` (it polls while a partition is refreshing; Reload otherwise)."""
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while (shown := row_states(driver)) != expected:
        if time.monotonic() > deadline:
            message = driver.find_element(By.ID, "message").text
            raise AssertionError(
                f"page shows {shown} ({message!r}), expected {expected}\n{stack.logs_tail()}"
            )
        if "refreshing" not in shown.values():
            driver.find_element(By.ID, "reload").click()
        time.sleep(1.0)


def test_partitions_page_shows_a_failed_partition_and_refreshes_it(
    stack: AirflowStack, client: AirflowApiClient, spark: Any, browser: Any
) -> None:
    from selenium.webdriver.common.by import By

    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.spec import load_spec

    spec_path = stack.dags_folder / "datasets.yaml"
    stack.wait_for_dag(client, UI_DAG_ID, poll=2)
    # US first (in this process: quicker than a DAG run), then a run in which EU cannot be written.
    refresh_dataset(load_spec(spec_path), UI_DATASET, partitions=[US], spark=spark)
    blocker = stack.dags_folder.parent / "acc" / UI_DATASET / EU
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    run = client.trigger_dag_run(UI_DAG_ID, {"partitions": None})
    failed_run = client.wait_for_dag_run(UI_DAG_ID, run["dag_run_id"], timeout=300, poll_interval=1)
    assert failed_run["state"] == "failed", stack.logs_tail()

    # The page, signed in as the admin with the session cookie the UI's login sets.
    browser.get(f"{stack.api_url}/partitions/?dag_id={UI_DAG_ID}")
    browser.add_cookie({"name": COOKIE_NAME, "value": token(stack, "admin"), "path": "/"})
    browser.refresh()
    wait_for_states(browser, stack, {EU: "failed", US: "fresh"}, timeout=60)
    eu_row = browser.find_element(By.CSS_SELECTOR, f'#rows tr[data-key-path="{EU}"]')
    assert "not a directory" in eu_row.text.lower() or "Error" in eu_row.text, eu_row.text
    links = [a.get_attribute("href") for a in eu_row.find_elements(By.TAG_NAME, "a")]
    failed_ti = f"/dags/{UI_DAG_ID}/runs/{quote(run['dag_run_id'], safe='')}/tasks/partition.refresh/mapped/0"
    assert any(link.endswith(failed_ti) for link in links), f"the failed task instance is linked: {links}"
    counts = {
        b.get_attribute("data-state-count"): b.text
        for b in browser.find_elements(By.CSS_SELECTOR, "#summary .badge")
    }
    assert counts == {"failed": "1 failed", "fresh": "1 fresh"}
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    browser.save_screenshot(str(SCREENSHOT))

    # Fix the cause, select EU, refresh it from the page.
    blocker.unlink()
    eu_row.find_element(By.CSS_SELECTOR, "input.pick").click()
    browser.find_element(By.ID, "refresh-selected").click()
    wait_for_states(browser, stack, {EU: "fresh", US: "fresh"}, timeout=300)

    # The JSON API: the document `status --partitions --json` prints, plus the DAG it came from.
    document = api(stack, "admin", "GET", f"dags/{UI_DAG_ID}/partitions").json()
    assert document.pop("airflow")["dag_id"] == UI_DAG_ID
    assert cli_status(document["spec"]) == document
    partitions = {p["key_path"]: p for p in document["datasets"][0]["partitions"]}
    writer = partitions[EU]["written_by"]
    assert writer["dag_id"] == UI_DAG_ID
    assert writer["task_id"] == "partition.refresh"
    assert writer["run_id"] != run["dag_run_id"], "EU was written by the run the page triggered"
    page_run = client.get_dag_run(UI_DAG_ID, writer["run_id"])
    assert page_run["conf"] == {"partitions": [EU]}, "the page's run refreshed exactly EU"
    assert partitions[US]["written_by"] is None, "US was written by the CLI, not by a task"


def test_partitions_api_applies_airflow_auth(stack: AirflowStack, client: AirflowApiClient) -> None:
    stack.wait_for_dag(client, UI_DAG_ID, poll=2)
    listing = api(stack, "viewer", "GET", "datasets")
    assert listing.status_code == 200
    assert UI_DAG_ID in {d["dag_id"] for d in listing.json()["datasets"]}
    assert api(stack, "viewer", "GET", f"dags/{UI_DAG_ID}/partitions").status_code == 200
    refused = api(stack, "viewer", "POST", f"dags/{UI_DAG_ID}/refresh", json={"partitions": [EU]})
    assert refused.status_code == 403, "a viewer may read partitions but not trigger a refresh"

    hidden = api(stack, "outsider", "GET", f"dags/{UI_DAG_ID}/partitions")
    assert hidden.status_code == 403, "a user who cannot read the DAG cannot read its partitions"
    outsider_listing = api(stack, "outsider", "GET", "datasets").json()["datasets"]
    assert UI_DAG_ID not in {d["dag_id"] for d in outsider_listing}
    assert (
        api(stack, "outsider", "POST", f"dags/{UI_DAG_ID}/refresh", json={"partitions": [EU]}).status_code
        == 403
    )
    anonymous = requests.get(f"{stack.api_url}/partitions/api/dags/{UI_DAG_ID}/partitions", timeout=30)
    assert anonymous.status_code == 401


def cli_status(spec_path: str) -> dict[str, Any]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["status", spec_path, UI_DATASET, "--partitions", "--json"]) == 0
    return dict(json.loads(out.getvalue()))


def test_the_providers_page_documentation_link_serves_the_readme(stack: AirflowStack) -> None:
    """The provider's documentation URL (the providers page links it) is served by its own plugin."""
    from airflow_partitions.provider_info import DOCUMENTATION_PATH, DOCUMENTATION_URL

    providers = requests.get(
        f"{stack.api_url}/api/v2/providers",
        headers={"Authorization": f"Bearer {token(stack, 'viewer')}"},
        timeout=30,
    )
    assert providers.status_code == 200
    ours = [p for p in providers.json()["providers"] if p["package_name"] == "airflow-partitions"]
    assert ours, "the provider is registered"
    assert ours[0]["documentation_url"] == DOCUMENTATION_URL
    page = requests.get(f"{stack.api_url}{DOCUMENTATION_PATH}", timeout=30)
    assert page.status_code == 200
    assert "<h2>Quick start</h2>" in page.text
    assert "make demo" in page.text
    api_docs = requests.get(f"{stack.api_url}/partitions/api/docs", timeout=30)
    assert api_docs.status_code == 200, "the API's own OpenAPI page moved under /partitions/api/"
    assert "swagger" in api_docs.text.lower()
