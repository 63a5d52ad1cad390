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
from airflow_e2e.sample import append_sales
from airflow_e2e.shared import (
    ATLAS_DAG_ID,
    ATLAS_DATASET,
    ATLAS_DAYS,
    ATLAS_REGIONS,
    DAG_ID,
    UI_DAG_ID,
    UI_DATASET,
    WIDE_DAG_ID,
    WIDE_PARTITIONS,
)
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


def row_text_and_links(driver: Any, key_path: str) -> tuple[str, list[str]]:
    """The visible text of the row of `key_path` and the targets of its links, read in one script (the
    page re-renders its rows while it polls, so element handles go stale between two calls)."""
    found = driver.execute_script(
        "const row = Array.from(document.querySelectorAll('#rows tr'))"
        ".find((r) => r.dataset.keyPath === arguments[0]);"
        "return row ? [row.innerText, Array.from(row.querySelectorAll('a')).map((a) => a.href)] : null;",
        key_path,
    )
    assert found is not None, f"no row for {key_path}"
    return str(found[0]), [str(link) for link in found[1]]


def click_when_rendered(driver: Any, css: str, timeout: float = 30) -> None:
    """Click the element `css` finds, finding it again if the page re-rendered it in between (it does
    while it polls)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, timeout, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(By.CSS_SELECTOR, css).click() or True
    )


def badge_counts(driver: Any) -> dict[str, str]:
    """State -> the text of its count badge, read in one script (the page re-renders while it polls)."""
    return dict(
        driver.execute_script(
            "return Object.fromEntries(Array.from("
            "document.querySelectorAll('#summary .badge[data-state-count]'))"
            ".map((badge) => [badge.dataset.stateCount, badge.textContent]));"
        )
    )


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
        time.sleep(0.3)


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
    try:
        run = client.trigger_dag_run(UI_DAG_ID, {"partitions": None})
        failed_run = client.wait_for_dag_run(UI_DAG_ID, run["dag_run_id"], timeout=300, poll_interval=1)
        assert failed_run["state"] == "failed", stack.logs_tail()

        # The page, signed in as the admin with the session cookie the UI's login sets.
        browser.get(f"{stack.api_url}/partitions/?dag_id={UI_DAG_ID}")
        browser.add_cookie({"name": COOKIE_NAME, "value": token(stack, "admin"), "path": "/"})
        browser.refresh()
        wait_for_states(browser, stack, {EU: "failed", US: "fresh"}, timeout=60)
        eu_text, links = row_text_and_links(browser, EU)
        assert "not a directory" in eu_text.lower() or "Error" in eu_text, eu_text
        run_path = quote(run["dag_run_id"], safe="")
        failed_ti = f"/dags/{UI_DAG_ID}/runs/{run_path}/tasks/partition.refresh/mapped/0"
        assert any(link.endswith(failed_ti) for link in links), f"the failed task instance is linked: {links}"
        assert badge_counts(browser) == {"failed": "1 failed", "fresh": "1 fresh"}
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(SCREENSHOT))
    finally:
        # Fix the cause (also when an assertion above failed: the later tests refresh EU too).
        blocker.unlink(missing_ok=True)

    # Select EU, refresh it from the page.
    click_when_rendered(browser, f'#rows tr[data-key-path="{EU}"] input.pick')
    browser.find_element(By.ID, "refresh-selected").click()
    assert browser.find_element(By.ID, "preview-title").text.startswith("Refresh 1 partition(s)")
    browser.find_element(By.ID, "preview-confirm").click()
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


# --- the page inside Airflow's UI: the nav entry and the DAG tab, in Airflow's sandboxed iframe ---------

DAG_TAB = f"/dags/{UI_DAG_ID}/plugin/partitions-of-dag"
NAV_PAGE = "/plugin/partitions"


def sign_in(driver: Any, stack: AirflowStack, user: str) -> None:
    """The session cookie Airflow's login sets, for `user`."""
    driver.switch_to.default_content()
    driver.get(f"{stack.api_url}/partitions/api/docs")
    driver.delete_all_cookies()
    driver.add_cookie({"name": COOKIE_NAME, "value": token(stack, user), "path": "/"})


def open_in_airflow(driver: Any, stack: AirflowStack, path: str) -> None:
    """Open Airflow's UI at `path` and enter the plugin's iframe (sandboxed as Airflow sandboxes it)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    driver.switch_to.default_content()
    driver.get(f"{stack.api_url}{path}")
    frame = WebDriverWait(driver, 60).until(
        expected_conditions.presence_of_element_located((By.CSS_SELECTOR, 'iframe[title="Partitions"]'))
    )
    sandbox = frame.get_attribute("sandbox")
    assert "allow-top-navigation" not in sandbox, sandbox
    assert "allow-popups" not in sandbox, sandbox
    driver.switch_to.frame(frame)
    WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.querySelector('#rows tr')"))


def page_state(driver: Any) -> dict[str, Any]:
    return dict(
        driver.execute_script(
            "return {rows: Array.from(document.querySelectorAll('#rows tr'))"
            ".map((row) => [row.dataset.keyPath, row.dataset.state]),"
            "message: document.getElementById('message').textContent,"
            "runId: document.getElementById('message').dataset.runId || null,"
            "paused: document.getElementById('paused').textContent};"
        )
    )


def wait_until(
    driver: Any, stack: AirflowStack, what: str, check: Any, timeout: float = 120
) -> dict[str, Any]:
    """Wait, without touching Reload, until the page by itself satisfies `check(page_state)`."""
    deadline = time.monotonic() + timeout
    while not check(shown := page_state(driver)):
        if time.monotonic() > deadline:
            raise AssertionError(f"the page never showed {what}: {shown}\n{stack.logs_tail(15)}")
        time.sleep(0.2)
    return shown


def test_inside_airflow_the_page_follows_runs_to_their_end_and_offers_to_unpause(
    stack: AirflowStack, client: AirflowApiClient, browser: Any
) -> None:
    """Defects 1, 2, 3 and dark mode, in the DAG tab: a run started elsewhere on a paused DAG is noticed,
    the paused banner unpauses it, the page follows the run to its end and says what it published; a
    partition refreshed by a run whose commit has not run shows "refreshed, waiting for commit"; links
    navigate Airflow despite the sandbox."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    stack.wait_for_dag(client, UI_DAG_ID, poll=2)
    sign_in(browser, stack, "admin")
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]}
    )
    client.set_paused(UI_DAG_ID, paused=True)
    run: dict[str, Any] = {}
    try:
        open_in_airflow(browser, stack, DAG_TAB)
        background = browser.execute_script("return getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(17, 24, 39)", f"dark mode follows Airflow's color mode: {background}"
        assert browser.execute_script(
            "return document.documentElement.scrollWidth <= document.documentElement.clientWidth"
        ), "no horizontal scrollbar in the DAG tab"
        assert "paused" in page_state(browser)["paused"]
        sla = browser.find_element(By.ID, "sla").text
        assert sla == "Freshness SLA 2h: met by every partition.", sla

        # A run started elsewhere (REST) while the page is open: noticed without Reload.
        run = client.trigger_dag_run(UI_DAG_ID, {"partitions": [EU]})
        wait_until(browser, stack, "EU refreshing", lambda s: dict(s["rows"]).get(EU) == "refreshing", 60)
        browser.find_element(By.ID, "unpause").click()
        wait_until(browser, stack, "the paused banner gone", lambda s: not s["paused"], 30)
        assert client.get_dag(UI_DAG_ID)["is_paused"] is False
        # Followed to its end: the run's outcome, and EU fresh, without Reload.
        done = wait_until(
            browser, stack, "the run's outcome", lambda s: s["runId"] == run["dag_run_id"], timeout=300
        )
        assert "succeeded: published 1, failed 0" in done["message"], done
        wait_until(browser, stack, "EU fresh", lambda s: dict(s["rows"]).get(EU) == "fresh", 60)

        # Part 3, the partition's detail: its refreshes over the retained versions, newest first.
        click_when_rendered(browser, f'#rows tr[data-key-path="{EU}"] a.detail-link')
        versions = WebDriverWait(browser, 30).until(
            lambda d: (
                found
                if len(
                    found := d.execute_script(
                        "return Array.from(document.querySelectorAll('#detail-history tr[data-version]'))"
                        ".map((row) => [Number(row.dataset.version), row.textContent]);"
                    )
                )
                >= 2
                else None
            )
        )
        assert versions[0][0] > versions[1][0], "newest first"
        assert run["dag_run_id"] in versions[0][1], "the newest refresh names the run that wrote it"
        browser.find_element(By.ID, "detail-close").click()

        # Refreshed but not committed: the commit of a run that is queued again on a paused DAG.
        client.set_paused(UI_DAG_ID, paused=True)
        client._send(
            "POST",
            f"/api/v2/dags/{UI_DAG_ID}/clearTaskInstances",
            json_body={
                "dry_run": False,
                "dag_run_id": run["dag_run_id"],
                "task_ids": ["commit"],
                "only_failed": False,
                "reset_dag_runs": True,
            },
        )
        waiting = wait_until(browser, stack, "EU waiting", lambda s: dict(s["rows"]).get(EU) == "waiting", 60)
        row_text, _ = row_text_and_links(browser, EU)
        assert "refreshed, waiting for commit" in row_text, (row_text, waiting)

        # Links navigate Airflow's UI (its router), though the sandbox forbids top navigation.
        link_css = f'#rows tr[data-key-path="{EU}"] a.airflow-link'
        target = browser.execute_script("return document.querySelector(arguments[0]).href;", link_css)
        click_when_rendered(browser, link_css)
        browser.switch_to.default_content()
        WebDriverWait(browser, 30).until(
            lambda d: d.current_url == target, f"the link did not navigate to {target}"
        )
    finally:
        browser.switch_to.default_content()
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
        # The cleared run: ended as it was (its commit already published EU), the DAG unpaused.
        if run:
            requests.patch(
                f"{stack.api_url}/api/v2/dags/{UI_DAG_ID}/dagRuns/{quote(run['dag_run_id'], safe='')}",
                json={"state": "success"},
                headers={"Authorization": f"Bearer {token(stack, 'admin')}"},
                timeout=30,
            )
        client.set_paused(UI_DAG_ID, paused=False)


def test_inside_airflow_many_partitions_page_sort_filter_and_preview(
    stack: AirflowStack, client: AirflowApiClient, browser: Any
) -> None:
    """Defects 4 and 5 in the nav page: 1,500 partitions paged, in natural order, filtered by state badges
    and by any spelling of a key (kept in the URL); select-all previews before it triggers anything."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    stack.wait_for_dag(client, WIDE_DAG_ID, poll=2)
    sign_in(browser, stack, "admin")
    open_in_airflow(browser, stack, NAV_PAGE)
    Select(browser.find_element(By.ID, "dataset")).select_by_value(WIDE_DAG_ID)
    keys = lambda: [k for k, _ in page_state(browser)["rows"]]  # noqa: E731
    WebDriverWait(browser, 120).until(lambda _: keys() and keys()[0].startswith("k="))
    assert keys()[:4] == ["k=0", "k=1", "k=2", "k=3"], "natural order: 0, 1, 2, 3 (not 0, 1, 10, 100)"
    assert len(keys()) == 100
    info = browser.find_element(By.ID, "page-info").text
    assert f"of {WIDE_PARTITIONS}" in info, info
    browser.find_element(By.ID, "page-next").click()
    assert keys()[0] == "k=100"
    browser.find_element(By.CSS_SELECTOR, 'th[data-sort="key"]').click()  # descending
    assert keys()[0] == f"k={WIDE_PARTITIONS - 1}"
    browser.find_element(By.CSS_SELECTOR, 'th[data-sort="key"]').click()

    # State badges filter (several at once); the filter lives in the URL.
    badge = browser.find_element(By.CSS_SELECTOR, "#summary .badge")
    state = badge.get_attribute("data-state-count")
    badge.click()
    assert {s for _, s in page_state(browser)["rows"]} == {state}
    assert f"states={state}" in browser.execute_script("return window.location.search")
    browser.find_element(By.CSS_SELECTOR, f'#summary .badge[data-state-count="{state}"]').click()

    # Select-all selects every shown partition (all pages); nothing is triggered before confirmation.
    runs_before = client._send("GET", f"/api/v2/dags/{WIDE_DAG_ID}/dagRuns")["total_entries"]
    browser.find_element(By.ID, "select-all").click()
    browser.find_element(By.ID, "refresh-selected").click()
    title = browser.find_element(By.ID, "preview-title").text
    assert title.startswith(f"Refresh {WIDE_PARTITIONS} partition(s)"), title
    assert browser.find_element(By.ID, "preview-more").text == f"and {WIDE_PARTITIONS - 20} more"
    browser.find_element(By.ID, "preview-cancel").click()
    WebDriverWait(browser, 10).until(
        lambda d: "Nothing triggered" in page_state(d)["message"], "cancelling the preview says so"
    )
    assert client._send("GET", f"/api/v2/dags/{WIDE_DAG_ID}/dagRuns")["total_entries"] == runs_before
    browser.find_element(By.ID, "select-all").click()

    # Every spelling of a two-field key finds it: the label, the comma form, Airflow's composite key.
    Select(browser.find_element(By.ID, "dataset")).select_by_value(DAG_ID)
    WebDriverWait(browser, 120).until(lambda _: keys() and keys()[0].startswith("region="))
    document = api(stack, "admin", "GET", f"dags/{DAG_ID}/partitions").json()
    # The overview of a two-field key is a grid: regions down, days across.
    regions = {p["key"].split("/")[0] for p in document["datasets"][0]["partitions"]}
    days = {p["key"].split("/")[1] for p in document["datasets"][0]["partitions"]}
    axes = browser.find_element(By.ID, "overview-axes").text
    assert axes == f"region ({len(regions)}) down, day ({len(days)}) across", axes
    partition = document["datasets"][0]["partitions"][0]
    label = partition["key"]
    assert label == "/".join(
        f"{name}={value}" for name, value in (part.split("=", 1) for part in label.split("/"))
    ), "the page shows the label form, name=value/name=value"
    values = [part.split("=", 1)[1] for part in label.split("/")]
    names = [part.split("=", 1)[0] for part in label.split("/")]
    comma = ", ".join(f"{n}={v}" for n, v in zip(names, values, strict=True))
    for spelling in (label, comma, "|".join(values)):
        box = browser.find_element(By.ID, "filter")
        box.clear()
        box.send_keys(spelling)
        assert keys() == [partition["key_path"]], f"{spelling!r} finds {keys()}"
        assert "filter=" in browser.execute_script("return window.location.search")


def test_inside_airflow_a_viewer_sees_why_refresh_is_disabled(
    stack: AirflowStack, client: AirflowApiClient, browser: Any
) -> None:
    """Defect 6 (a viewer): the refresh buttons are disabled with the reason, not a raw HTTP 403."""
    from selenium.webdriver.common.by import By

    stack.wait_for_dag(client, UI_DAG_ID, poll=2)
    sign_in(browser, stack, "viewer")
    try:
        open_in_airflow(browser, stack, DAG_TAB)
        assert browser.find_element(By.ID, "refresh-needed").get_attribute("disabled")
        reason = browser.find_element(By.ID, "permission").text
        assert "User, Op or Admin role" in reason, reason
    finally:
        sign_in(browser, stack, "admin")


# --- the overview grid of a dataset in every state, its drag-selected ranges, the detail's row chart -----

ATLAS_EU_DAY1 = "region=EU/day=2026-01-01T00:00:00"
ATLAS_EU_DAY1_PATH = "region=EU/day=2026-01-01T00%3A00%3A00"  # its canonical key path (the catalog's)


def atlas_in_every_state(stack: AirflowStack, spark: Any) -> None:
    """`page_atlas` refreshed in this process into real states: days 1-20 fresh (APAC's day 3 failed: its
    directory is taken by a file), days 21-28 missing, EU's days 2-10 stale (new source rows), EU's day 1
    written twice (3 rows, then 6). Idempotent: the session may run this module's tests again.

    The in-process Arrow path refreshes the good partitions (quick); the failing one goes through the
    Spark path with `allow_partial` (the Arrow path records the failure alike, see test_arrow_refresh.py),
    which records a partition's failure as a refresh task does."""
    from airflow_partitions.refresh import refresh_dataset
    from airflow_partitions.spec import load_spec
    from airflow_partitions.table import open_handle

    spec = load_spec(stack.dags_folder / "datasets.yaml")
    if open_handle(spec, spec.dataset(ATLAS_DATASET)).catalog.latest() is not None:
        return
    acc = stack.dags_folder.parent / "acc" / ATLAS_DATASET
    blocker = acc / "region=APAC" / "day=2026-01-03T00%3A00%3A00"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    refresh_dataset(
        spec,
        ATLAS_DATASET,
        where="day < TIMESTAMP '2026-01-21' AND NOT (region = 'APAC' AND day = TIMESTAMP '2026-01-03')",
        strategy="arrow",
    )
    failing = refresh_dataset(
        spec,
        ATLAS_DATASET,
        partitions=["region=APAC/day=2026-01-03T00:00:00"],
        strategy="spark",
        spark=spark,
        allow_partial=True,
    )
    assert len(failing.failed) == 1, failing
    append_sales(
        stack.dags_folder.parent / ATLAS_DATASET, rows=30, days=10, regions=("EU",), name="sales-1.parquet"
    )
    refresh_dataset(spec, ATLAS_DATASET, partitions=[ATLAS_EU_DAY1], strategy="arrow")


def drag_on_overview(driver: Any, from_key: str, to_key: str) -> None:
    """Press on `from_key`'s cell of the overview, move to `to_key`'s, release (real pointer events)."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    def offset(key: str) -> tuple[int, int]:
        # The cell's centre relative to the canvas's centre (Selenium's origin), in CSS pixels.
        return tuple(
            driver.execute_script(
                "const p = documentData.datasets[0].partitions.find((x) => x.key === arguments[0]);"
                "const canvas = document.getElementById('overview');"
                "const box = canvas.getBoundingClientRect();"
                "const unit = overviewCells.size * box.width / canvas.width;"
                "return [Math.round((p._cell[1] + .5) * unit - box.width / 2),"
                " Math.round((p._cell[0] + .5) * unit - box.height / 2)];",
                key,
            )
        )

    canvas = driver.find_element(By.ID, "overview")
    start, end = offset(from_key), offset(to_key)
    ActionChains(driver).move_to_element_with_offset(
        canvas, *start
    ).click_and_hold().move_to_element_with_offset(canvas, *end).release().perform()


def test_inside_airflow_the_overview_grid_selects_a_dragged_range_and_the_detail_charts_rows(
    stack: AirflowStack, client: AirflowApiClient, spark: Any, browser: Any
) -> None:
    """The overview of a region x day dataset in real states (fresh, stale, failed, missing): a range
    dragged on the grid selects the rectangle of partitions between the two cells and opens the launch
    preview (nothing triggered until confirmed); a partition's detail charts its rows over the versions
    that wrote it, a point per write. The screenshots in the README are taken here."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    stack.wait_for_dag(client, ATLAS_DAG_ID, poll=2)
    atlas_in_every_state(stack, spark)
    document = api(stack, "admin", "GET", f"dags/{ATLAS_DAG_ID}/partitions").json()
    states = document["datasets"][0]["states"]
    assert {s for s, n in states.items() if n} >= {"fresh", "stale", "failed", "missing"}, states

    sign_in(browser, stack, "admin")
    open_in_airflow(browser, stack, NAV_PAGE)
    Select(browser.find_element(By.ID, "dataset")).select_by_value(ATLAS_DAG_ID)
    WebDriverWait(browser, 120).until(
        lambda d: d.execute_script(
            "return documentData && documentData.airflow.dag_id === arguments[0] && overviewCells"
            " && overviewCells.grid",
            ATLAS_DAG_ID,
        )
    )
    counts = {state: text.split(" ")[0] for state, text in badge_counts(browser).items()}
    assert counts == {s: str(n) for s, n in states.items() if n}, "the badges count the document's states"
    axes = browser.find_element(By.ID, "overview-axes").text
    assert axes == f"region ({len(ATLAS_REGIONS)}) down, day ({ATLAS_DAYS}) across", axes
    browser.save_screenshot(str(SCREENSHOT.with_name("partitions-overview.png")))

    # A drag from (EU, day 2) to (US, day 5): regions EU..US down (EU, LATAM, US), days 2..5 across.
    runs_before = client._send("GET", f"/api/v2/dags/{ATLAS_DAG_ID}/dagRuns")["total_entries"]
    drag_on_overview(browser, "region=EU/day=2026-01-02T00:00:00", "region=US/day=2026-01-05T00:00:00")
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "preview").get_attribute("open"))
    expected = {f"region={r}/day=2026-01-0{d}T00:00:00" for r in ("EU", "LATAM", "US") for d in range(2, 6)}
    title = browser.find_element(By.ID, "preview-title").text
    assert title.startswith(f"Refresh {len(expected)} partition(s) of {ATLAS_DAG_ID}"), title
    listed = {li.text for li in browser.find_elements(By.CSS_SELECTOR, "#preview-list li")}
    assert listed == expected, "exactly the rectangle between the two cells"
    browser.save_screenshot(str(SCREENSHOT.with_name("partitions-launch-preview.png")))
    browser.find_element(By.ID, "preview-cancel").click()
    # The dialog's close event and the promise after it run as later tasks: the message follows shortly.
    WebDriverWait(browser, 10).until(
        lambda d: "Nothing triggered" in page_state(d)["message"], "cancelling the preview says so"
    )
    assert browser.find_element(By.ID, "refresh-selected").text == f"Refresh selected ({len(expected)})"
    assert client._send("GET", f"/api/v2/dags/{ATLAS_DAG_ID}/dagRuns")["total_entries"] == runs_before

    # The detail of EU's day 1: a point per version that wrote it, its rows, oldest first.
    history = api(
        stack, "admin", "GET", f"dags/{ATLAS_DAG_ID}/partition", params={"key_path": ATLAS_EU_DAY1_PATH}
    )
    written = [h for h in reversed(history.json()["history"]) if h["change"] == "written"]
    assert [h["rows"] for h in written] == [3, 6], "written twice: 3 rows, then 6"
    box = browser.find_element(By.ID, "filter")
    box.clear()
    box.send_keys("EU|2026-01-01T00:00:00")
    assert [k for k, _ in page_state(browser)["rows"]] == [ATLAS_EU_DAY1_PATH], "Airflow's key finds it"
    click_when_rendered(browser, "#rows tr a.detail-link")
    points = WebDriverWait(browser, 30).until(
        lambda d: d.execute_script(
            "const points = document.querySelectorAll('#detail-chart circle');"
            "return points.length ? Array.from(points).map((c) => [Number(c.dataset.version),"
            " Number(c.dataset.rows), Number(c.getAttribute('cy'))]) : null;"
        )
    )
    assert [(v, r) for v, r, _ in points] == [(h["version"], h["rows"]) for h in written]
    assert points[1][2] < points[0][2], "more rows is drawn higher"
    browser.save_screenshot(str(SCREENSHOT.with_name("partitions-detail.png")))
    browser.find_element(By.ID, "detail-close").click()


# --- Airflow's own trigger dialog of a refresh DAG ---------------------------------------------------------


def test_the_trigger_dialog_offers_a_partition_key_and_refuses_a_wrong_key_in_words(
    stack: AirflowStack, client: AirflowApiClient, browser: Any
) -> None:
    """The unscheduled refresh DAG reports a partitioned timetable, so Airflow's trigger dialog shows its
    Partition Key field; a key of the wrong shape, there or in the Partitions param, is refused before a
    run exists, with what is wrong and what the keys look like (not jsonschema's regex dump)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    stack.wait_for_dag(client, DAG_ID, poll=2)
    assert client.get_dag(DAG_ID)["timetable_partitioned"] is True
    runs_before = client._send("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"]

    # The REST API (the dialog's own request): both fields, a friendly 400 and no run.
    for body, field in (
        ({"logical_date": None, "conf": {"partitions": ["region=EU"]}}, "Partitions:"),
        ({"logical_date": None, "partition_key": "EU"}, "Partition Key:"),
    ):
        response = requests.post(
            f"{stack.api_url}/api/v2/dags/{DAG_ID}/dagRuns",
            json=body,
            headers={"Authorization": f"Bearer {token(stack, 'admin')}"},
            timeout=30,
        )
        assert response.status_code == 400, response.text
        detail = response.json()["detail"]
        assert detail.startswith(f"Nothing was triggered: {field}"), detail
        assert "region=<value>/day=<value>" in detail, detail
        assert "Failed validating" not in detail, detail
        assert "^(?:" not in detail, detail
    assert client._send("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"] == runs_before

    # The dialog itself: the Partition Key field is there; a wrong key gets the same words.
    sign_in(browser, stack, "admin")
    browser.get(f"{stack.api_url}/dags/{DAG_ID}")
    WebDriverWait(browser, 60).until(
        lambda d: d.find_elements(By.XPATH, "//button[normalize-space()='Trigger']")
    )[0].click()
    advanced = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.XPATH, "//*[@role='dialog']//button[contains(., 'Advanced Options')]")
    )
    advanced[0].click()
    field = WebDriverWait(browser, 30).until(
        lambda d: d.find_elements(By.CSS_SELECTOR, "[role=dialog] input[name=partitionKey]")
    )[0]
    assert browser.find_elements(By.XPATH, "//*[@role='dialog']//*[normalize-space()='Partition Key']")
    field.send_keys("EU")
    browser.save_screenshot(str(SCREENSHOT.with_name("trigger-partition-key.png")))
    browser.find_element(By.XPATH, "//*[@role='dialog']//button[normalize-space()='Trigger']").click()
    message = WebDriverWait(browser, 30).until(
        lambda d: next(
            (e.text for e in d.find_elements(By.XPATH, "//*[contains(text(), 'Nothing was triggered')]")),
            None,
        )
    )
    assert "Partition Key: partition key 'EU' must start with `region=`" in message, message
    assert client._send("GET", f"/api/v2/dags/{DAG_ID}/dagRuns")["total_entries"] == runs_before
