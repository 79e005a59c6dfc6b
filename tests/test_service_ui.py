"""The memory inspector page (/ui of `gpuir serve`) in a real headless browser: Debian's Chromium driven by
Playwright's Python package, against a real server on loopback.

Every check compares what the page shows with the API's own JSON answer to the same request (fetched here with
httpx), never with the page's code. Skips, saying why, only when Chromium or Playwright cannot be had
(`make test` installs both: scripts/install_browser.sh, the dev extra). GPUIR_UI_SCREENSHOTS=DIR writes the
screenshots docs/service.md shows into DIR.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from gpuir.service.client import MemoryClient
from gpuir.service.keys import KeyStore
from gpuir.service.testing import ServerProcess

CHROMIUM = os.environ.get("GPUIR_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run", "--disable-sync"]
INJECT = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned = 2"> hello <b>bold</b>'
TOPICS = ("travel", "cooking", "music")
#: A configuration of three record channels, fused (RRF): its hits carry each channel's rank and contribution.
HYBRID = {"channels": [{"kind": "bm25", "depth": 50, "weight": 1.0}, {"kind": "temporal", "depth": 50, "weight": 0.5},
                       {"kind": "entity", "depth": 50, "weight": 0.3}], "fusion": "rrf"}


def _alice_records():
    out = []
    for i in range(45):
        topic = TOPICS[i % 3]
        out.append({"id": f"a{i:02d}", "text": f"alice note {i} about {topic} and the {topic} plans",
                    "session": f"s{i % 4}", "role": "user" if i % 2 else "assistant", "agent": "planner",
                    "time": f"2023-05-{1 + i % 28:02d}T10:{i:02d}:00Z", "metadata": {"topic": topic, "n": i}})
    out.append({"id": "inject", "text": INJECT, "session": "s9",
                "metadata": {"html": '<img src=x onerror="window.__pwned = 3">'}})
    return out


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("ui") / "mem"
    from gpuir.storage.dirlock import claim_dir

    claim_dir(root, "memory")
    ks = KeyStore(root)
    keys = {t: ks.add(t) for t in ("alice", "bob")}
    keys["operator"] = ks.add_operator()
    (root.parent / "mem.configs").mkdir()
    (root.parent / "mem.configs" / "hybrid.json").write_text(json.dumps(HYBRID))
    srv = ServerProcess(root, ["--operator-reads"]).start(timeout=300)  # a loaded machine starts slowly
    a = MemoryClient(srv.url, keys["alice"])
    a.add(_alice_records())
    a.update({"id": "a07", "text": "alice note 7 about travel, changed: the trip moved to June"})
    MemoryClient(srv.url, keys["bob"]).add([{"id": f"b{i}", "text": f"bob secret zebra {i} travel", "session": "bs"}
                                            for i in range(5)])
    yield srv, keys
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def browser():
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        pytest.skip(f"no Chromium at {CHROMIUM}: `make setup` installs Debian's chromium when run as root "
                    "(scripts/install_browser.sh); or set GPUIR_CHROMIUM")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright's Python package is missing: "
                                   "pip install 'gpuir[dev]' (never `playwright install`: the system Chromium is used)")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@pytest.fixture()
def page(browser, server):
    srv, _ = server
    # bypass_csp: Playwright's waits evaluate their predicates, which the page's policy forbids; and the markup
    # test then shows that the page escapes by itself, without the policy's help
    ctx = browser.new_context(viewport={"width": 1100, "height": 900}, bypass_csp=True)
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.urls, pg.dialogs, pg.console_errors = [], [], []
    pg.on("request", lambda r: pg.urls.append(r.url))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("console", lambda m: pg.console_errors.append(m.text) if m.type == "error" else None)
    pg.goto(srv.url + "/ui")
    yield pg
    ctx.close()


def _shot(pg, name):
    out = os.environ.get("GPUIR_UI_SCREENSHOTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        pg.screenshot(path=str(Path(out) / name), full_page=True)


def _sign_in(pg, key):
    pg.fill("#key", key)
    pg.click("#signin-button")
    pg.wait_for_selector("#app:not([hidden])")


def _api(srv, key, method, path, **kw):
    return httpx.request(method, srv.url + path, headers={"Authorization": f"Bearer {key}"}, timeout=30, **kw)


def _hits_on_page(pg):
    return pg.eval_on_selector_all("#hits > li", """els => els.map(li => ({
        id: li.querySelector('.rid').textContent, score: li.querySelector('.score').textContent,
        text: li.querySelector('.text').textContent,
        fields: Object.fromEntries([...li.querySelectorAll('dt')].map(dt => [dt.textContent,
                                                                           dt.nextElementSibling.textContent]))}))""")


# ---------------------------------------------------------------------- the page and its assets
def test_the_page_and_its_assets_come_from_the_package_with_a_strict_policy(server):
    srv, _ = server
    r = httpx.get(srv.url + "/ui")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe-inline" not in csp
    assert "http://" not in r.text.replace("http://www.w3.org", "") and "https://" not in r.text  # no external asset
    for name, kind in (("ui.js", "javascript"), ("ui.css", "css")):
        a = httpx.get(f"{srv.url}/ui/static/{name}")
        assert a.status_code == 200 and kind in a.headers["content-type"]
        assert not any(s in a.text for s in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "https://"))
    assert httpx.get(srv.url + "/ui/static/..%2Fapp.py").status_code == 404
    assert httpx.get(srv.url + "/ui/static/index.htm").status_code == 404
    # the wheel carries them: pyproject's package-data matches every file of gpuir/service/static
    import fnmatch

    import tomllib

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["gpuir"]
    for f in (root / "gpuir/service/static").iterdir():
        assert any(fnmatch.fnmatch(f"service/static/{f.name}", g) for g in globs), f


# ---------------------------------------------------------------------- sign in, search, page
def test_sign_in_search_and_page_through_records_as_the_api_answers(page, server):
    srv, keys = server
    pg = page
    _sign_in(pg, keys["alice"])
    assert "alice" in pg.text_content("#who-text")
    where = {"session": "s1", "role": "user"}
    pg.fill("#f-session", "s1")
    pg.select_option("#f-role", "user")
    pg.fill("#q", "travel plans")
    pg.fill("#k", "5")
    pg.click("#search-button")
    pg.wait_for_selector("#hits > li")
    api = _api(srv, keys["alice"], "POST", "/v1/tenants/alice/search",
               json={"queries": ["travel plans"], "k": 5, "where": where}).json()["results"][0]["hits"]
    got = _hits_on_page(pg)
    assert len(api) >= 2 and [h["id"] for h in got] == [h["id"] for h in api]
    for h, a in zip(got, api):
        assert h["text"] == a["text"]
        assert float(h["score"].split()[1]) == pytest.approx(a["score"], abs=1e-4)
        assert h["fields"]["session"] == "s1" == a["session"] and h["fields"]["role"] == "user"
        assert json.loads(h["fields"]["metadata"]) == a["metadata"]
    _shot(pg, "ui-search.png")

    # records: the same filter, 4 a page, through the API's cursors
    pg.click("button[data-tab=records-tab]")
    pg.select_option("#f-role", "")
    pg.fill("#r-limit", "4")
    pg.click("#records-button")
    seen = []
    while True:
        pg.wait_for_function("n => document.querySelector('#records-status').textContent.startsWith('page ' + n)",
                             arg=len(seen) + 1)
        seen.append(pg.eval_on_selector_all("#records tbody tr.record td.rid", "els => els.map(e => e.textContent)"))
        if pg.is_disabled("#records-next"):
            break
        pg.click("#records-next")
    pages, cursor = [], None
    while True:
        params = {"where": json.dumps({"session": "s1"}), "limit": 4, **({"cursor": cursor} if cursor else {})}
        body = _api(srv, keys["alice"], "GET", "/v1/tenants/alice/records", params=params).json()
        pages.append([r["id"] for r in body["records"]])
        cursor = body["cursor"]
        if not cursor:
            break
    assert seen == pages and sum(map(len, pages)) == 11 and len(pages) >= 3
    assert "last page" in pg.text_content("#records-status")
    _shot(pg, "ui-records.png")

    # a record's history: its earlier version, as the API gives it
    pg.fill("#f-session", "")
    pg.click("#records-button")
    pg.wait_for_function("document.querySelector('#records-status').textContent.startsWith('page 1')")
    while not pg.query_selector("#records tbody tr.record:has(td.rid:text-is('a07'))"):
        pg.click("#records-next")
        pg.wait_for_timeout(200)
    pg.click("#records tbody tr.record:has(td.rid:text-is('a07')) button")
    pg.wait_for_selector("tr.history .version")
    versions = _api(srv, keys["alice"], "GET", "/v1/tenants/alice/records/a07/history").json()["versions"]
    shown = pg.eval_on_selector_all("tr.history .version span", "els => els.map(e => JSON.parse(e.textContent))")
    assert shown == versions and versions[0]["text"] == "alice note 7 about cooking and the cooking plans"

    # the key: in this tab's sessionStorage only, in no URL the page asked for
    assert pg.evaluate("sessionStorage.getItem('gpuir.inspector.key')") == keys["alice"]
    assert pg.evaluate("localStorage.length") == 0 and pg.evaluate("document.cookie") == ""
    secret = keys["alice"].split(".", 2)[2]
    assert pg.urls and not any(secret in u for u in pg.urls)
    assert not pg.console_errors, pg.console_errors
    assert secret not in srv.output()  # nor in the server's log


def test_a_fused_search_shows_each_channels_rank_and_contribution(page, server):
    srv, keys = server
    pg = page
    _sign_in(pg, keys["alice"])
    q = "travel plans on 2023-05-03"
    pg.fill("#q", q)
    pg.fill("#config", "hybrid")
    pg.fill("#k", "4")
    pg.click("#search-button")
    pg.wait_for_selector("#hits > li table.channels")
    api = _api(srv, keys["alice"], "POST", "/v1/tenants/alice/search",
               json={"queries": [q], "k": 4, "config": "hybrid", "explain": True}).json()["results"][0]["hits"]
    shown = pg.eval_on_selector_all("#hits > li", """els => els.map(li => [...li.querySelectorAll(
        'table.channels tr')].slice(1).map(tr => [...tr.children].map(td => td.textContent)))""")
    assert len(shown) == len(api) == 4
    for rows, h in zip(shown, api):
        assert [r[0] for r in rows] == ["bm25", "temporal", "entity"]
        for name, rank, contrib in rows:
            c = h["channels"][name]
            assert rank == ("-" if c["rank"] is None else str(c["rank"]))
            assert contrib == ("-" if c["contribution"] is None else f"{c['contribution']:.5f}")
        assert sum(c["contribution"] or 0 for c in h["channels"].values()) == pytest.approx(h["score"], rel=1e-5)
    assert any(h["channels"]["temporal"]["rank"] for h in api)  # the date made the temporal channel run
    _shot(pg, "ui-channels.png")


def test_memory_view_draws_what_the_overview_route_answers(page, server):
    srv, keys = server
    pg = page
    _sign_in(pg, keys["alice"])
    pg.click("button[data-tab=memory-tab]")
    pg.wait_for_selector("#plot-segments svg")
    o = _api(srv, keys["alice"], "GET", "/v1/tenants/alice/overview").json()
    assert o["records"] == 46 and o["untimed"] == 1 and o["no_session"] == 0
    assert sum(b["records"] for b in o["over_time"]) == 45
    assert {s["session"]: s["records"] for s in o["sessions"]} == {"s0": 12, "s1": 11, "s2": 11, "s3": 11, "s9": 1}
    assert pg.eval_on_selector_all("#plot-time rect.bar", "els => els.length") == len(o["over_time"])
    titles = pg.eval_on_selector_all("#plot-sessions rect.bar title", "els => els.map(e => e.textContent)")
    assert titles == [f"{s['session']}: {s['records']}" for s in o["sessions"]]
    assert pg.eval_on_selector_all("#plot-segments rect.bar", "els => els.length") == len(o["segments"])
    # polling every second: the status line's time changes without a click
    pg.check("#memory-poll")
    before = pg.text_content("#memory-status")
    pg.wait_for_function("s => document.querySelector('#memory-status').textContent !== s", arg=before,
                         timeout=15_000)
    pg.uncheck("#memory-poll")
    _shot(pg, "ui-memory.png")


# ---------------------------------------------------------------------- bad input, markup
def test_a_bad_filter_shows_the_apis_message(page, server):
    srv, keys = server
    pg = page
    _sign_in(pg, keys["alice"])
    pg.fill("#q", "travel")
    pg.fill("#f-meta", '{"topic": {"like": "tra"}}')
    pg.click("#search-button")
    pg.wait_for_function("document.querySelector('#search-error').textContent.length > 0")
    r = _api(srv, keys["alice"], "POST", "/v1/tenants/alice/search",
             json={"queries": ["travel"], "k": 10, "where": {"metadata": {"topic": {"like": "tra"}}}})
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert pg.text_content("#search-error") == ".".join(d["loc"]) + ": " + d["msg"]
    assert "like" in d["msg"] and pg.eval_on_selector_all("#hits > li", "e => e.length") == 0
    _shot(pg, "ui-bad-filter.png")
    # a time that is not one: the records list shows the API's message too
    pg.fill("#f-meta", "")
    pg.fill("#f-from", "last tuesday")
    pg.click("button[data-tab=records-tab]")
    pg.click("#records-button")
    pg.wait_for_function("document.querySelector('#records-error').textContent.length > 0")
    r = _api(srv, keys["alice"], "GET", "/v1/tenants/alice/records",
             params={"where": json.dumps({"time": {"gte": "last tuesday"}}), "limit": 20})
    assert r.status_code == 422
    d = r.json()["detail"][0]
    assert pg.text_content("#records-error") == ".".join(d["loc"]) + ": " + d["msg"]


def test_a_record_holding_markup_is_shown_as_text(page, server):
    _srv, keys = server
    pg = page
    _sign_in(pg, keys["alice"])
    pg.fill("#f-session", "s9")
    pg.fill("#q", "hello bold script")
    pg.click("#search-button")
    pg.wait_for_selector("#hits > li")
    hit = _hits_on_page(pg)[0]
    assert hit["id"] == "inject" and hit["text"] == INJECT
    assert json.loads(hit["fields"]["metadata"]) == {"html": '<img src=x onerror="window.__pwned = 3">'}
    pg.click("button[data-tab=records-tab]")
    pg.click("#records-button")
    pg.wait_for_selector("#records tbody tr.record")
    assert pg.text_content("#records tbody td.text") == INJECT
    # nothing ran and nothing became markup: no script, img or b element anywhere in the data
    pg.wait_for_timeout(300)
    assert pg.evaluate("window.__pwned") is None and not pg.dialogs
    assert pg.evaluate("document.querySelectorAll('#hits script, #hits img, #hits b, #records script, "
                       "#records img, #records b').length") == 0


# ---------------------------------------------------------------------- tenants
def test_a_tenant_key_sees_only_its_tenant_through_the_page(page, server):
    _srv, keys = server
    pg = page
    _sign_in(pg, keys["bob"])
    assert "bob" in pg.text_content("#who-text") and pg.is_hidden("#scope-label")
    pg.fill("#q", "alice travel plans")
    pg.click("#search-button")
    pg.wait_for_function("document.querySelector('#search-status').textContent.includes('hits')")
    ids = [h["id"] for h in _hits_on_page(pg)]
    assert ids and all(i.startswith("b") for i in ids)
    assert not any("alice" in h["text"] for h in _hits_on_page(pg))
    pg.click("button[data-tab=records-tab]")
    pg.fill("#r-limit", "100")
    pg.click("#records-button")
    pg.wait_for_selector("#records tbody tr.record")
    listed = pg.eval_on_selector_all("#records tbody td.rid", "els => els.map(e => e.textContent)")
    assert sorted(listed) == [f"b{i}" for i in range(5)]
    # the page's own calls with bob's key, aimed at alice: refused by the API, as any client would be
    status = pg.evaluate("""async () => {
        const k = sessionStorage.getItem('gpuir.inspector.key');
        const h = {Authorization: 'Bearer ' + k, 'Content-Type': 'application/json'};
        const s = await fetch('/v1/tenants/alice/search', {method: 'POST', headers: h,
                                                           body: JSON.stringify({queries: ['travel']})});
        const l = await fetch('/v1/tenants/alice/records', {headers: h});
        const o = await fetch('/v1/tenants/alice/overview', {headers: h});
        const t = await fetch('/v1/tenants', {headers: h});
        return [s.status, l.status, o.status, t.status];
    }""")
    assert status == [403, 403, 403, 403]
    # a key naming alice with bob's secret is no key at all: the page says so and stays signed out
    pg.click("#signout")
    forged = "gpuir.alice." + keys["bob"].split(".", 2)[2]
    pg.fill("#key", forged)
    pg.click("#signin-button")
    pg.wait_for_function("document.querySelector('#signin-error').textContent.length > 0")
    assert "unknown or revoked" in pg.text_content("#signin-error") and pg.is_hidden("#app")
    assert pg.evaluate("sessionStorage.length") == 0


def test_an_operator_key_reads_each_tenant_in_its_scope(page, server):
    srv, keys = server
    pg = page
    _sign_in(pg, keys["operator"])
    opts = pg.eval_on_selector_all("#scope option", "els => els.map(e => e.value)")
    assert opts == [t["tenant"] for t in _api(srv, keys["operator"], "GET", "/v1/tenants").json()["tenants"]]
    assert opts == ["alice", "bob"]
    pg.select_option("#scope", "bob")
    pg.fill("#q", "zebra")
    pg.click("#search-button")
    pg.wait_for_selector("#hits > li")
    assert sorted(h["id"] for h in _hits_on_page(pg)) == [f"b{i}" for i in range(5)]
    # reading is all an operator key does: a write is refused
    r = _api(srv, keys["operator"], "POST", "/v1/tenants/bob/records", json={"records": [{"id": "x", "text": "x"}]})
    assert r.status_code == 403 and _api(srv, keys["operator"], "DELETE", "/v1/tenants/bob/records/b1").status_code == 403


def test_without_operator_reads_an_operator_key_lists_and_reads_no_tenant(tmp_path):
    root = tmp_path / "mem"
    from gpuir.storage.dirlock import claim_dir

    claim_dir(root, "memory")
    ks = KeyStore(root)
    alice, op = ks.add("alice"), ks.add_operator()
    with ServerProcess(root) as srv:
        MemoryClient(srv.url, alice).add([{"id": "1", "text": "hello"}])
        assert _api(srv, op, "GET", "/v1/tenants").status_code == 403
        assert _api(srv, op, "GET", "/v1/tenants/alice/records").status_code == 403
        assert _api(srv, op, "GET", "/v1/tenants/alice/overview").status_code == 403
        assert _api(srv, alice, "GET", "/v1/tenants").status_code == 403
        assert _api(srv, alice, "GET", "/v1/tenants/alice/overview").json()["records"] == 1


def test_make_installs_the_systems_chromium_and_never_playwrights_browsers():
    """`make setup` and `make test` run the script that installs Debian's chromium; nothing runs
    `playwright install` (a browser download from outside the package registries)."""
    root = Path(__file__).resolve().parents[1]
    script = (root / "scripts/install_browser.sh").read_text()
    assert "apt-get install -y -q chromium" in script
    make = (root / "Makefile").read_text()
    test_rule = make[make.index("\ntest:"):].split("\n\n")[0]
    assert "browser" in test_rule.splitlines()[1] and "sh scripts/install_browser.sh" in make
    for f in [root / "Makefile", root / ".ci/run", *root.glob("scripts/*")]:
        assert "playwright install" not in f.read_text().replace("`playwright install`", ""), f
