"""Screenshots of the memory inspector over a LoCoMo conversation's turns (docs/service.md shows them).

Serves a new memory with `gpuir serve` on loopback, adds one LoCoMo conversation's turns (one record per
turn, tenant = the conversation) through the API, then drives Debian's Chromium with Playwright: signs in with
the tenant's key, searches, and saves the search and the memory view under docs/img/.

    PYTHONPATH=$PWD python scripts/ui_screenshots.py [--conversation conv-26] [--out docs/img]

Needs the LoCoMo data (GPUIR_DATA or ../shared/data) and /usr/bin/chromium (scripts/install_browser.sh).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from gpuir.eval.records import locomo_records
from gpuir.service.client import MemoryClient
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess
from gpuir.storage.dirlock import claim_dir

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversation", default="conv-26", help="the LoCoMo sample_id (default: %(default)s)")
    ap.add_argument("--question", default="When did Caroline go to the LGBTQ support group?")
    ap.add_argument("--out", default="docs/img", help="folder of the PNG files (default: %(default)s)")
    ap.add_argument("--chromium", default="/usr/bin/chromium")
    a = ap.parse_args(argv)
    from playwright.sync_api import sync_playwright

    recs = [r for r in locomo_records(unit="turn") if r["tenant"] == a.conversation]
    for r in recs:  # JSON over the wire: times as ISO 8601
        if hasattr(r.get("time"), "isoformat"):
            r["time"] = r["time"].isoformat()
    if not recs:
        print(f"no LoCoMo conversation {a.conversation!r}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "mem"
        claim_dir(root, "memory")
        key = KeyStore(root).add(a.conversation)
        srv = ServerProcess(root).start(timeout=300)
        try:
            MemoryClient(srv.url, key).add(recs)
            print(f"{len(recs)} turns of {a.conversation} added", file=sys.stderr)
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path=a.chromium, args=ARGS, headless=True)
                pg = b.new_page(viewport={"width": 1100, "height": 900})
                pg.set_default_timeout(60_000)
                pg.goto(srv.url + "/ui")
                pg.fill("#key", key)
                pg.click("#signin-button")
                pg.wait_for_selector("#app:not([hidden])")
                pg.fill("#q", a.question)
                pg.fill("#k", "5")
                pg.click("#search-button")
                pg.wait_for_selector("#hits > li")
                pg.screenshot(path=str(out / "ui-locomo-search.png"), full_page=True)
                pg.click("button[data-tab=memory-tab]")
                pg.wait_for_selector("#plot-segments svg")
                pg.screenshot(path=str(out / "ui-locomo-memory.png"), full_page=True)
                b.close()
        finally:
            srv.stop()
    print(f"wrote {out / 'ui-locomo-search.png'} and {out / 'ui-locomo-memory.png'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
