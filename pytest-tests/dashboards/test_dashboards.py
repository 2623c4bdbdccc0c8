"""The dashboards in headless Chromium: every page on a fixture store, the
key content a maintainer reads, filters, JSON twins, 404s, the empty store,
the static export opened from disk, and hostile input that must not run."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from .conftest import start, stop
from .fixture_store import NOW, SCRIPT

SHIPPED = "rust-phy-enum-check"
LR = "ax88772a-link-recovery"

# path, text every maintainer must find on it
PAGES = [
    ("/", ["Series", SHIPPED, LR, "ready to merge", "changes requested", "awaiting review"]),
    (f"/series/{SHIPPED}", ["Verdict history", "superseded"]),
    (f"/series/{SHIPPED}/v8", ["Farm matrix", "Patches: apply and build", "flaky", "Mbit/s"]),
    (f"/series/{SHIPPED}/v7", ["changes requested", "FAIL", "new failure"]),
    (f"/series/{LR}/v3", ["awaiting review", "left", "Measurements", "within noise"]),
    (f"/series/{LR}/v2", ["New warnings", "unused variable"]),
    (f"/series/{LR}/v1", ["new failure", "regression", f"reproduce: phyfarm repro {LR}/v1 "]),
    (f"/compare/{LR}/v1/{LR}/v3", ["Compare", "fixed", "Δ B vs A"]),
    ("/compare", ["Compare two revisions"]),
    ("/trends", ["Trends", "Mbit/s", "ms", LR]),
    (
        "/run/20260610T090000Z-lr-v1",
        ["Reproduce", "tcg", "10.0.2", "WARNING: CPU: 0", "Call Trace"],
    ),
    ("/farm", ["Recent runs", "Flaky checks", "farm.link_flap.flap10", "Farm check durations"]),
]


def shot(page, tmp_path, name: str) -> None:
    page.screenshot(path=str(tmp_path / f"{name}.png"), full_page=True)


@pytest.mark.parametrize(("path", "texts"), PAGES, ids=[p for p, _ in PAGES])
def test_every_page_renders_with_its_key_content(page, server, tmp_path, path, texts):
    resp = page.goto(server(path))
    assert resp.status == 200
    body = page.inner_text("body")
    for t in texts:
        assert t in body, f"{path}: {t!r} missing"
    assert page.errors == [], f"{path}: console errors (a CSP violation?) {page.errors}"
    assert page.outside == [], f"{path} fetched from outside: {page.outside}"
    name = path.strip("/").replace("/", "_") or "index"
    shot(page, tmp_path, name)


def test_verdicts_have_text_not_only_colour(page, server):
    page.goto(server("/"))
    for badge in page.locator(".verdict").all():
        assert badge.text_content().strip(), "every verdict badge says its state in words"
    colours = {
        b.evaluate("e => getComputedStyle(e).backgroundColor")
        for b in page.locator("tr.rev .verdict").all()
    }
    assert len(colours) >= 3, f"distinct verdict colours: {colours}"


def test_superseded_revisions_are_folded_and_filters_work(page, server):
    page.goto(server("/"))
    folded = page.locator("details.superseded").first
    assert not folded.evaluate("d => d.open")
    v7 = page.locator("tr.rev", has_text="enum exhaustiveness").filter(
        has=page.locator("a.revlink", has_text="v7")
    )
    assert not v7.is_visible(), "superseded v7 is folded"
    page.check("#filter-superseded")
    assert v7.is_visible()
    page.select_option("#filter-state", "awaiting-review")
    rows = page.locator("tr.rev:visible")
    assert rows.count() >= 1
    for r in rows.all():
        assert "awaiting review" in r.inner_text()
    assert "state=awaiting-review" in page.url, "the filter is in the URL"
    page.select_option("#filter-state", "")
    page.fill("#filter-q", "genphy_soft_reset")
    assert page.locator("tr.rev:visible").count() == 0, "search looks at titles (patch 1) only"
    page.fill("#filter-q", "soft-reset the PHY")
    visible = page.locator("tr.rev:visible")
    assert visible.count() >= 1
    assert all(LR in r.evaluate("e => e.closest('section').dataset.series") for r in visible.all())


def test_revision_links_lead_to_run_logs(page, server):
    page.goto(server(f"/series/{LR}/v1"))
    page.locator("table.matrix a.log").first.click()
    page.wait_for_load_state()
    assert "/run/20260610T090000Z-lr-v1" in page.url
    assert page.locator("mark.oops").count() >= 2, "the oops lines are highlighted"


def test_compare_form_navigates(page, server):
    page.goto(server("/compare"))
    page.select_option("select[name=a]", f"{SHIPPED}/v7")
    page.select_option("select[name=b]", f"{SHIPPED}/v8")
    page.click("#compare-form button")
    page.wait_for_url(f"**/compare/{SHIPPED}/v7/{SHIPPED}/v8")
    assert "Compare rust-phy-enum-check/v7 and rust-phy-enum-check/v8" in page.inner_text("h1")


def test_charts_have_axes_and_units(page, server):
    page.goto(server("/trends"))
    charts = page.locator("svg.chart")
    assert charts.count() >= 4
    labels = page.locator("svg.chart .axis-label").all_text_contents()
    assert "Mbit/s" in labels and "ms" in labels and "revision" in labels, labels
    assert page.locator("svg.chart rect.band").count() >= 3, "the base samples drawn"
    assert page.locator("svg.chart circle.pt-regression").count() >= 1, "v1 regressed"


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.mark.parametrize(("path", "_"), PAGES, ids=[p for p, _ in PAGES])
def test_json_twins(server, path, _):
    twin = "/index.json" if path == "/" else path + ".json"
    code, ctype, body = fetch(server(twin))
    assert code == 200 and ctype == "application/json"
    assert "generated" in json.loads(body)


def test_unknown_series_and_revisions_are_404_pages(page, server):
    for path in [f"/series/{SHIPPED}/v99", "/series/nope", "/run/nope", "/nothing/here"]:
        resp = page.goto(server(path))
        assert resp.status == 404, path
        assert "404" in page.inner_text("h1")
        assert page.locator("a", has_text="Back to the series list").count() == 1


def test_hostile_subject_and_ansi_log_do_not_execute(page, server, tmp_path):
    for path in [
        "/",
        "/series/evil/v1",
        "/run/20260613T100000Z-evil-1",
        "/farm",
        "/compare/evil/v1/evil/v1",
    ]:
        resp = page.goto(server(path))
        assert resp.status == 200, path
        page.wait_for_timeout(200)
        assert page.dialogs == [], f"{path}: script ran: {page.dialogs}"
        text = page.inner_text("body")
        assert "\x1b" not in text and "pwned" not in text, path
        assert page.locator("img").count() == 0, f"{path}: injected element"
        assert page.locator("b", has_text="bold").count() == 0, path
        assert page.errors == [], f"{path}: {page.errors}"
    page.goto(server("/series/evil/v1"))
    assert page.get_by_text(SCRIPT, exact=True).first.is_visible(), "the subject shows literally"
    page.goto(server("/run/20260613T100000Z-evil-1"))
    assert page.locator("mark.oops", has_text="BUG: kernel NULL pointer dereference").count() >= 1
    assert "<script>alert(5)</script>" in page.inner_text("pre.log")
    assert page.locator("script").count() == 1, "only the app's own script element"
    shot(page, tmp_path, "hostile-run")


def test_empty_store_says_how_to_run_the_first_job(page, dashboard_bin, tmp_path):
    s = start(dashboard_bin, tmp_path / "none.sqlite")
    try:
        resp = page.goto(s("/"))
        assert resp.status == 200
        text = page.inner_text("main")
        assert "No results yet" in text and "make run" in text and "phyfarm run" in text
        shot(page, tmp_path, "empty")
    finally:
        stop(s)
    assert not (tmp_path / "none.sqlite").exists(), "serving never creates a store"


def test_static_export_opens_from_disk(page, phyfarm, store, tmp_path):
    out = tmp_path / "site"
    r = phyfarm("--store", str(store), "dashboard", "export", str(out), "--now", NOW)
    assert r.code == 0, r.describe()
    for f in ["index.html", "index.json", f"series/{SHIPPED}/v8.html", f"series/{SHIPPED}/v8.json"]:
        assert (out / f).is_file(), f
    page.goto((out / "index.html").as_uri())
    assert SHIPPED in page.inner_text("body")
    page.locator("a.revlink", has_text="v8").first.click()
    page.wait_for_load_state()
    assert page.url.endswith(f"series/{SHIPPED}/v8.html")
    assert "Farm matrix" in page.inner_text("body")
    assert page.errors == [], page.errors
    # Styled from the export's own static/ folder.
    colour = page.locator("header.top").evaluate("e => getComputedStyle(e).backgroundColor")
    assert colour == "rgb(31, 78, 121)", colour


def test_phyfarm_serve_runs_the_dashboard_binary(phyfarm, dashboard_bin):
    r = phyfarm("serve", "--help")
    assert r.code == 0, r.describe()
    assert "--listen" in r.stdout and "127.0.0.1:8080" in r.stdout
    r = phyfarm("dashboard", "export", "--help")
    assert r.code == 0 and "--base-url" in r.stdout, r.describe()
