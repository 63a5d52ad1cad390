"""The Partitions page at 10,000 partitions: time to first paint of the overview and table, in Chromium.

    python -m benchmarks.bench_page_overview            # 10,000 partitions (100 regions x 100 days), 5 runs
    python -m benchmarks.bench_page_overview --quick    # the same, 2 runs

The page (`plugins/page.py`, the very HTML and script Airflow serves) is served from loopback with its JSON
API answered from memory (a document shaped as `status --partitions --json` prints it, every state
present), so what is measured is the browser's work: fetching and parsing the document, the overview
(canvas heat map over every partition), the badges and the first page of the table. Debian's headless
chromium through chromedriver, as the browser tests use.

Measured with the Performance API, from navigation start: `first-contentful-paint` (the page's shell) and
the page's own `partitions-rendered` mark (set once the overview and the first table page are in the DOM),
plus the next animation frame after it (the paint that shows them). Median of the runs. The anchor is the
same page with 100 partitions in the same run; ratio = 10,000-partition paint / anchor paint. The goal is
a paint within 1 s on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from airflow_partitions.plugins.page import PAGE_HTML
from benchmarks import load
from benchmarks.support import free_port

STATES = ("fresh", "fresh", "fresh", "stale", "failed", "missing", "refreshing")


def document(regions: int, days: int) -> dict[str, Any]:
    partitions = []
    counts: dict[str, int] = {}
    for region in range(regions):
        for day in range(days):
            state = STATES[(region * 7 + day) % len(STATES)]
            counts[state] = counts.get(state, 0) + 1
            key = f"region=r{region}/day=2026-{1 + day // 28:02d}-{1 + day % 28:02d}"
            failure = {"error": "OSError: /data/x\nTraceback...", "dag_id": None, "run_id": None}
            partitions.append(
                {
                    "key_path": key,
                    "key": key,
                    "state": state,
                    "reason": None,
                    "rows": region * 1000 + day,
                    "bytes": (region + 1) * 4096,
                    "files": 1,
                    "refreshed_at": "2026-01-01T00:00:00+00:00",
                    "source_fingerprint": None,
                    "written_by": None,
                    "failure": failure if state == "failed" else None,
                }
            )
    report = {
        "dataset": "bench",
        "latest_version": 3,
        "operation": "refresh",
        "committed_at": "2026-01-01T00:00:00+00:00",
        "states": counts,
        "discovery_error": None,
        "partitions": partitions,
    }
    return {
        "spec": "bench.yaml",
        "datasets": [report],
        "airflow": {"dag_id": "bench", "is_paused": False, "can_trigger": True, "can_unpause": True},
    }


@contextmanager
def serve(body: bytes) -> Iterator[str]:
    routes = {
        "/partitions/": (PAGE_HTML.encode(), "text/html"),
        "/partitions/api/datasets": (
            json.dumps({"datasets": [{"dag_id": "bench", "dataset": "bench", "spec": "x"}]}).encode(),
            "application/json",
        ),
        "/partitions/api/dags/bench/partitions": (body, "application/json"),
        "/partitions/api/dags/bench/runs": (
            json.dumps({"dag_id": "bench", "is_paused": False, "runs": []}).encode(),
            "application/json",
        ),
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            content, kind = routes.get(self.path.split("?")[0], (b"{}", "application/json"))
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(content)))
            self.end_headers()
            self.wfile.write(content)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/partitions/?dag_id=bench"
    finally:
        server.shutdown()
        server.server_close()


MEASURE = """
const done = arguments[arguments.length - 1];
const wait = () => {
  const mark = performance.getEntriesByName("partitions-rendered")[0];
  if (!mark) { setTimeout(wait, 5); return; }
  requestAnimationFrame(() => {
    const fcp = performance.getEntriesByName("first-contentful-paint")[0];
    done({rendered: mark.startTime, painted: performance.now(), shell: fcp ? fcp.startTime : null,
          rows: document.querySelectorAll("#rows tr").length});
  });
};
wait();
"""


def measure(driver: Any, url: str, runs: int) -> dict[str, float]:
    results = []
    for _ in range(runs):
        driver.get(url)
        results.append(driver.execute_async_script(MEASURE))
    return {
        name: statistics.median(float(r[name]) for r in results if r[name] is not None)
        for name in ("shell", "rendered", "painted")
    }


def main() -> None:
    from selenium import webdriver

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = load.parse_args(parser)
    runs = 2 if args.quick else 5
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900"):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService("/usr/bin/chromedriver"))
    driver.set_script_timeout(120)
    try:
        with serve(json.dumps(document(10, 10)).encode()) as url:
            measure(driver, url, 1)  # warm-up: the browser's first page load is not the page's cost
            anchor = measure(driver, url, runs)
        big = json.dumps(document(100, 100)).encode()
        with serve(big) as url:
            measured = measure(driver, url, runs)
    finally:
        driver.quit()
    print(f"document: 10,000 partitions, {len(big) / 1e6:.1f} MB of JSON; median of {runs} runs")
    print(f"{'partitions':>12} {'shell paint ms':>15} {'rendered ms':>12} {'first paint ms':>15}")
    for label, result in (("100 (anchor)", anchor), ("10,000", measured)):
        print(f"{label:>12} {result['shell']:>15.0f} {result['rendered']:>12.0f} {result['painted']:>15.0f}")
    print(f"ratio 10,000 / anchor (first paint): {measured['painted'] / anchor['painted']:.2f}")
    verdict = "within" if measured["painted"] <= 1000 else "over"
    print(f"time to first paint at 10,000 partitions: {measured['painted']:.0f} ms ({verdict} the 1 s goal)")


if __name__ == "__main__":
    main()
