"""The Partitions page shows a change data capture dataset's replication slot, its lag and the WAL it
retains: the page's own script (headless chromium) renders the document `status --partitions --json`
gives for a real dataset on the wal_level=logical cluster (the API serves that document; its fetches are
answered with it here, so no Airflow stack is needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from test_cdc_postgres import accounts_project, create_accounts, execute

from airflow_partitions.cli.status import dataset_status
from airflow_partitions.plugins.page import PAGE_HTML
from airflow_partitions.refresh import refresh_dataset

pytestmark = [pytest.mark.postgres, pytest.mark.browser]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"

# Answers the page's fetches with the document (`DOCUMENT`), before its own script runs.
FETCH_STUB = """<script>
window.fetch = async (path) => {
  const body = path === "api/datasets" ? {datasets: [{dag_id: "d", dataset: "accounts"}]}
    : path.endsWith("/partitions") ? DOCUMENT : {runs: [], is_paused: false};
  return new Response(JSON.stringify(body), {status: 200, headers: {"Content-Type": "application/json"}});
};
</script>"""


def format_bytes(size: int) -> str:
    """The page's formatBytes."""
    value, unit = float(size), 0
    units = ["B", "KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    return f"{size} B" if unit == 0 else f"{value:.1f} {units[unit]}"


def rendered_badge(document: dict[str, Any], tmp_path: Path) -> str:
    from selenium import webdriver
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    for program in (CHROMIUM, CHROMEDRIVER):
        if shutil.which(program) is None:
            pytest.fail(f"{program} is missing: `make system-deps` installs chromium and chromium-driver")
    stub = f"<script>const DOCUMENT = {json.dumps(document)};</script>{FETCH_STUB}"
    page = tmp_path / "page.html"
    page.write_text(PAGE_HTML.replace("<head>", "<head>" + stub, 1))
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    try:
        driver.get(page.as_uri() + "?dag_id=d")
        WebDriverWait(driver, 20).until(lambda d: d.find_elements(By.CSS_SELECTOR, "[data-cdc-slot]"))
        return str(driver.find_element(By.CSS_SELECTOR, "[data-cdc-slot]").text)
    finally:
        driver.quit()


def test_partitions_page_shows_the_slot_its_lag_and_retained_wal(
    pg_logical_database: str, tmp_path: Path
) -> None:
    url = pg_logical_database
    create_accounts(url)
    project = accounts_project(tmp_path, url)
    refresh_dataset(project, "accounts")
    # Changes the acceleration does not hold yet: the slot lags and retains their WAL.
    execute(url, "UPDATE public.accounts SET note = repeat('x', 5000) WHERE id < 20")
    report = dataset_status(project, project.dataset("accounts"), partitions=True)
    cdc = report["cdc"]
    slot = cdc["slot"]
    assert slot is not None, cdc
    assert slot["lag_bytes"] > 0
    assert slot["retained_wal_bytes"] >= slot["lag_bytes"]
    badge = rendered_badge({"spec": "spec.yaml", "datasets": [report], "airflow": {"dag_id": "d"}}, tmp_path)
    assert badge == (
        f"slot {cdc['slot_name']}: lag {format_bytes(slot['lag_bytes'])}, retains "
        f"{format_bytes(slot['retained_wal_bytes'])} of WAL"
    )
