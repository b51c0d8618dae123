"""How long ``/docs`` (Swagger UI, offline) takes to show the API, in Chromium, per fresh server.

For each of ``--repeats`` rounds it starts ``python -m app.cli serve`` on a free loopback port
over a fresh temporary store (:mod:`service`), waits until it is ready, optionally (``--busy``)
queues a 30-epoch training of ``mixer_digits`` in the server's own worker and waits until it
runs (a busy server: the training holds the interpreter between its torch calls), waits
``--after`` seconds (a user opens the page a moment after the start), then opens ``/docs`` in a
fresh headless Chromium context twice: the first visit to this server, and a second one. For each
visit it reports

- ``shown``: from navigation until Swagger UI has drawn the operations (five or more tags),
- ``schema``: how long the ``/openapi.json`` request took (the server builds the schema on the
  first request for it unless it was built before),
- ``cpu``: the page's main-thread CPU time (Chromium's ThreadTime metric): Swagger UI's own
  work, the same whatever the server does.

Medians over the rounds are printed as a markdown table, then :mod:`harness`'s machine line
(and with ``--json PATH`` every visit's figures). The figures are the browser's and the page's
own (navigation to drawn, the resource timing, Chromium's thread time), not the clocks
:func:`harness.interleaved` reads around a job, so the rounds are this script's. Needs
Debian's Chromium at ``/usr/bin/chromium`` (``apt-get install -y chromium``) and Playwright.

    .venv/bin/python bench/bench_docs.py                # idle server, 3 rounds
    .venv/bin/python bench/bench_docs.py --busy         # a training running in the server
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import harness  # bench/harness.py and service.py, beside this script
import httpx
from service import serve

CHROMIUM = "/usr/bin/chromium"


def visit(browser: Any, url: str) -> dict[str, float]:
    """One visit of ``url``/docs in a fresh context: shown, schema and cpu, in seconds."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        page = ctx.new_page()
        cdp = ctx.new_cdp_session(page)
        cdp.send("Performance.enable")
        start = time.perf_counter()
        page.goto(f"{url}/docs")
        page.locator(".opblock-tag").nth(4).wait_for(timeout=120_000)  # no eval: the CSP
        shown = time.perf_counter() - start
        schema = page.evaluate(
            "performance.getEntriesByType('resource')"
            ".filter(e => e.name.endsWith('/openapi.json'))"
            ".map(e => e.responseEnd - e.startTime)[0]"
        )
        metrics = {m["name"]: m["value"] for m in cdp.send("Performance.getMetrics")["metrics"]}
        return {"shown": shown, "schema": schema / 1000, "cpu": metrics["ThreadTime"]}
    finally:
        ctx.close()


def one_round(browser: Any, busy: bool, after: float) -> list[dict[str, float]]:
    with (
        tempfile.TemporaryDirectory(prefix="bench-docs-") as tmp,
        serve(Path(tmp) / "var", {"CKA_DEVICE": "cpu", "CKA_LOG_LEVEL": "warning"}) as server,
    ):
        if busy:
            with httpx.Client(base_url=server.base, timeout=60) as api:
                r = api.post(
                    "/v1/trainings",
                    json={"arch": "mixer_digits", "dataset_id": 1, "epochs": 30},
                )
                r.raise_for_status()
                while api.get(r.headers["location"]).json()["status"] != "running":
                    time.sleep(0.1)
        time.sleep(after)
        return [visit(browser, server.base), visit(browser, server.base)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy", action="store_true", help="a training runs in the server")
    parser.add_argument("--after", type=float, default=1.0, help="seconds from ready to /docs")
    harness.options(parser, repeat=3, clock=None, threads=None)
    args = harness.parse(parser)
    from playwright.sync_api import sync_playwright

    rounds = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        try:
            for _ in range(args.repeat):
                rounds.append(one_round(browser, args.busy, args.after))
        finally:
            browser.close()
    print(f"\n/docs, {'busy' if args.busy else 'idle'} server, medians of {args.repeat}\n")
    print("| visit | shown | /openapi.json | page main-thread CPU |")
    print("|---|---|---|---|")
    for i, name in enumerate(("first", "second")):
        med = {k: statistics.median(r[i][k] for r in rounds) for k in ("shown", "schema", "cpu")}
        print(f"| {name} | {med['shown']:.2f} s | {med['schema']:.2f} s | {med['cpu']:.2f} s |")
    visits = [dict(zip(("first", "second"), r, strict=True)) for r in rounds]
    harness.finish(args.json, {"busy": args.busy, "after_s": args.after, "rounds": visits})


if __name__ == "__main__":
    main()
