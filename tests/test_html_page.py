# SPDX-License-Identifier: GPL-2.0-or-later
"""madtrace report DIR --html FILE: the interactive page, in a real browser.

Contract exercised:
  madtrace record --data -o DIR -- PROG;  madtrace attach --data ... PID
  madtrace report DIR --html FILE [--force]

Debian's chromium, headless, driven by selenium, opens the page of a real
trace (tests/progs/data_threads: threads, globals, heap): the page starts
with the metrics header and then the heat map; a click on a table header
sorts the rows as the numbers of ``report --json`` say; the filter box
leaves only the rows containing its text; "show all" shows every row; the
heat map canvas is drawn, zooms, and names the page under the mouse; the
browser logged no script error; the page loads nothing from outside; a
screenshot is a real picture.  Without the browser: the table helper's cap
and attributes, the page of a stripped binary (one line for the sources,
after the heat map) and of an attached process (no "exit status None"),
and the --png heat map (one row per region without any access, folded
runs of untouched rows, labels that end before the addresses).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from madtrace.report import html as page_html
from madtrace.report.page_script import SCRIPT

from .util import madtrace, prog, report_json, start_ready

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def _browser_missing() -> str | None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed in this Python"
    return None


needs_browser = pytest.mark.skipif(_browser_missing() is not None,
                                   reason=_browser_missing() or "")


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """One recording of data_threads and its page, for the module."""
    base = tmp_path_factory.mktemp("html-page")
    directory = str(base / "trace")
    result = madtrace("record", "-q", "--data", "-o", directory, "--",
                      prog("data_threads", "O0-pie"), timeout=300)
    if result.returncode == 77:
        pytest.skip(result.stderr.decode().strip())
    assert result.returncode == 0, result.stderr
    page = str(base / "report.html")
    result = madtrace("report", directory, "--html", page)
    assert result.returncode == 0, result.stderr
    return directory, page


@pytest.fixture(scope="module")
def browser():
    missing = _browser_missing()
    if missing:
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1400,1000", "--force-device-scale-factor=1"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    yield driver
    driver.quit()


def open_page(driver, path: str) -> None:
    driver.get("file://" + os.path.abspath(path))
    driver.get_log("browser")          # (what an earlier page logged)


def errors(driver) -> list:
    return [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]


def table_box(driver, caption: str):
    from selenium.webdriver.common.by import By
    for box in driver.find_elements(By.CSS_SELECTOR, "div.tbl"):
        heads = box.find_elements(By.CSS_SELECTOR, ".tbl-head .caption")
        if heads and heads[0].text.strip() == caption:
            return box
    raise AssertionError(f"no table {caption!r}")


# JS: the visible rows of a table, each as its cells' (data-v or text)
ROWS_JS = """
var box = arguments[0], out = [];
box.querySelectorAll("tbody tr").forEach(function (r) {
  if (r.hidden || r.classList.contains("gap")) return;
  out.push(Array.prototype.map.call(r.cells, function (c) {
    return c.hasAttribute("data-v") ? c.getAttribute("data-v") : c.textContent; }));
});
return out;
"""


def visible_rows(driver, box) -> list[list[str]]:
    return driver.execute_script(ROWS_JS, box)


def header(driver, box, name: str):
    from selenium.webdriver.common.by import By
    for th in box.find_elements(By.CSS_SELECTOR, "thead th"):
        if th.text.strip() == name:
            return th
    raise AssertionError(f"no column {name!r}")


# ------------------------------------------------------------------ browser
@needs_browser
def test_page_in_a_browser(trace, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    directory, page = trace
    text = open(page).read()
    # self-contained: nothing loaded from elsewhere
    assert not re.search(r"https?://", text)
    assert not re.search(r"""(src|href)\s*=\s*["']?(//|[a-z]+:)""", text)
    assert "<link" not in text and "@import" not in text

    heat = report_json(directory, "--kind", "heatmap")
    open_page(browser, page)

    # what matters first: the metrics header, then the heat map
    order = browser.execute_script(
        "return Array.prototype.map.call(document.body.children, function (e) {"
        "  return e.tagName.toLowerCase() + '#' + e.id; });")
    assert order[0] == "header#metrics" and order[1] == "section#kind-heatmap", order
    assert [e for e in order if e.startswith("section")][-1] == "section#kind-source", order
    metrics = {e.get_attribute("data-metric"): e.get_attribute("data-v")
               for e in browser.find_elements(By.CSS_SELECTOR, "header .card")}
    assert int(metrics["accesses"]) == heat["loads"] + heat["stores"]
    assert (int(metrics["loads"]), int(metrics["stores"])) == (heat["loads"], heat["stores"])
    assert int(metrics["touched_pages"]) == heat["touched_pages"]
    assert metrics["ended"] == "exit status 0"
    assert int(metrics["threads"]) >= 4                      # main and its 3 workers

    # sort: the regions by loads, as --json counts them (the largest first, then reversed)
    box = table_box(browser, "Regions, the most accessed first")
    header(browser, box, "loads").click()
    got = [(row[0], int(row[5])) for row in visible_rows(browser, box)]
    expected = sorted(((r["label"], r["loads"]) for r in heat["regions"]), key=lambda x: -x[1])
    assert [n for _, n in got] == [n for _, n in expected]
    assert sorted(got) == sorted(expected)
    assert header(browser, box, "loads").get_attribute("aria-sort") == "descending"
    header(browser, box, "loads").click()
    assert [int(row[5]) for row in visible_rows(browser, box)] == sorted(n for _, n in expected)
    # text: A to Z (case ignored); addresses: by value, not as text
    header(browser, box, "region").click()
    labels = [row[0] for row in visible_rows(browser, box)]
    assert labels == sorted((r["label"] for r in heat["regions"]), key=str.lower)
    header(browser, box, "start").click()
    header(browser, box, "start").click()
    assert [int(row[1]) for row in visible_rows(browser, box)] == \
        sorted(r["start"] for r in heat["regions"])

    # filter: only the rows containing the text stay
    field = box.find_element(By.CSS_SELECTOR, "input.filter")
    field.send_keys("of libc")
    rows = visible_rows(browser, box)
    wanted = [r["label"] for r in heat["regions"] if "of libc" in r["label"].lower()]
    assert sorted(row[0] for row in rows) == sorted(wanted) and len(wanted) == 2
    assert "2 of" in box.find_element(By.CSS_SELECTOR, ".count").text
    field.clear()
    field.send_keys("no such region at all")
    assert visible_rows(browser, box) == []
    browser.execute_script("arguments[0].value = ''; arguments[0].dispatchEvent(new Event('input'))",
                           field)
    assert len(visible_rows(browser, box)) == len(heat["regions"])

    # a long table: its first rows, then every row
    long_box = next(b for b in browser.find_elements(By.CSS_SELECTOR, "div.tbl")
                    if any(x.is_displayed() for x in b.find_elements(By.CSS_SELECTOR, "button.all")))
    limit, rows = int(long_box.get_attribute("data-limit")), int(long_box.get_attribute("data-rows"))
    assert len(visible_rows(browser, long_box)) == limit < rows
    button = long_box.find_element(By.CSS_SELECTOR, "button.all")
    browser.execute_script("arguments[0].scrollIntoView()", button)
    button.click()
    assert len(visible_rows(browser, long_box)) == rows

    # the heat map: drawn (coloured cells), a tooltip naming the page under the mouse, zoom
    canvas = browser.find_element(By.CSS_SELECTOR, "#kind-heatmap canvas")
    browser.execute_script("arguments[0].scrollIntoView()", canvas)
    found = browser.execute_script("""
        var c = arguments[0], ctx = c.getContext('2d'), w = c.width, h = c.height;
        var d = ctx.getImageData(0, 0, w, h).data, painted = 0, hot = null;
        var dpr = window.devicePixelRatio || 1;
        for (var y = 0; y < h; y++) for (var x = Math.round(300 * dpr); x < w; x++) {
          var i = (y * w + x) * 4, r = d[i], g = d[i + 1], b = d[i + 2];
          if (r !== 255 || g !== 255 || b !== 255) painted++;
          if (!hot && r > 200 && b < 120 && r - b > 100) hot = [x / dpr, y / dpr];
        }
        return [w, h, painted, hot];""", canvas)
    width, height, painted, hot = found
    assert width > 300 and height > 50 and painted > 500, found
    assert hot is not None, "no accessed page drawn in colour"
    ActionChains(browser).move_to_element_with_offset(
        canvas, int(hot[0] - canvas.size["width"] / 2 + 3),
        int(hot[1] - canvas.size["height"] / 2 + 3)).perform()
    tip = browser.find_element(By.CSS_SELECTOR, ".hm-tip")
    assert tip.is_displayed()
    assert re.search(r"page 0x[0-9a-f]+", tip.text) and "accesses" in tip.text, tip.text
    assert any(r["label"] in tip.text for r in heat["regions"]), tip.text
    space = browser.find_element(By.CSS_SELECTOR, ".hm-space")
    before = space.size["height"]
    zoom_in = browser.find_element(By.CSS_SELECTOR, "button[data-zoom='1']")
    browser.execute_script("arguments[0].scrollIntoView()", zoom_in)
    zoom_in.click()
    zoom_in.click()
    assert space.size["height"] > before

    # a picture of it, and no script error on the way
    shot = tmp_path / "page.png"
    browser.execute_script("window.scrollTo(0, 0)")
    assert browser.save_screenshot(str(shot))
    from PIL import Image
    image = Image.open(shot).convert("RGB")
    assert image.size[0] >= 1000 and image.size[1] >= 500
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is None or len(colours) > 50     # text, cards, the heat map's colours
    assert errors(browser) == []


@needs_browser
def test_long_table_caps_rows_and_sorts_the_hidden_ones(browser, tmp_path):
    count = page_html.MAX_ROWS + 700
    rows = [[f"item {i:05d}", (i * 7919) % 10007, page_html.cell(f"{i / 10:.1f} KB", i * 100)]
            for i in range(count)]
    doc = ("<!DOCTYPE html><html><head><meta charset='utf-8'><style>" + page_html.CSS
           + "</style></head><body>"
           + page_html.table(["name", "value", "size"], rows, caption="big", limit=10)
           + "<script>" + SCRIPT + "</script></body></html>")
    path = tmp_path / "big.html"
    path.write_text(doc)
    open_page(browser, str(path))
    box = table_box(browser, "big")
    assert int(box.get_attribute("data-rows")) == page_html.MAX_ROWS
    assert f"{count - page_html.MAX_ROWS} more rows are not in the page" in box.text
    assert len(visible_rows(browser, box)) == 10
    header(browser, box, "value").click()                     # numbers: the largest first
    embedded = [r[1] for r in rows[:page_html.MAX_ROWS]]
    assert [int(r[1]) for r in visible_rows(browser, box)] == sorted(embedded, reverse=True)[:10]
    header(browser, box, "size").click()                      # on data-v, not on "x KB"
    assert [int(r[2]) for r in visible_rows(browser, box)] == \
        [i * 100 for i in range(page_html.MAX_ROWS - 1, page_html.MAX_ROWS - 11, -1)]
    field = box.find_element("css selector", "input.filter")
    field.send_keys("item 0012")                               # items 00120..00129
    assert sorted(r[0] for r in visible_rows(browser, box)) == [f"item 0012{d}" for d in range(10)]
    assert errors(browser) == []


# --------------------------------------------------------------- no browser
class Parsed(HTMLParser):
    def __init__(self):
        super().__init__()
        self.sections: list[str] = []
        self.empty_in: dict[str, int] = {}
        self.details: list[tuple[str, bool]] = []
        self._section = ""
        self._p_empty = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("data-kind", "")
            self.sections.append(self._section)
        elif tag == "p" and a.get("class") == "empty":
            self.empty_in[self._section] = self.empty_in.get(self._section, 0) + 1
        elif tag == "details":
            self.details.append((self._section, "open" in a))


def test_table_helper_cells_and_cap():
    out = page_html.table(["name", "n", "size"],
                          [["a", 1234, page_html.cell("1.2 KB", 1234)], ["b", None, None]])
    assert 'data-type="num"' in out and '<td data-v="1234">1,234</td>' in out
    assert '<td data-v="1234">1.2 KB</td>' in out
    assert "input" not in out                               # a short table: no filter box
    many = page_html.table(["n"], [[i] for i in range(page_html.MAX_ROWS * 2)])
    assert many.count("<tr") == page_html.MAX_ROWS + 1       # + the header row
    assert f"{page_html.MAX_ROWS} more rows are not in the page" in many
    assert many.count(" hidden>") == page_html.MAX_ROWS - page_html.VISIBLE_ROWS
    assert page_html.table(["n"], [], caption="things") == \
        '<p class="empty">things: none.</p>'


def test_stripped_binary_sources_in_one_line_after_the_heat_map(tmp_path):
    directory = str(tmp_path / "stripped")
    result = madtrace("record", "-q", "--data", "-o", directory, "--",
                      prog("data_globals", "O2-pie-stripped"))
    assert result.returncode == 0, result.stderr
    out = tmp_path / "stripped.html"
    result = madtrace("report", directory, "--html", str(out))
    assert result.returncode == 0, result.stderr
    parsed = Parsed()
    parsed.feed(out.read_text())
    assert parsed.sections[0] == "heatmap" and parsed.sections[-1] == "source"
    assert parsed.empty_in.get("source") == 1
    # the functions without lines: folded (a <details> not open) and limited
    assert ("source", False) in parsed.details
    assert "No access was made by an instruction with a source line" in out.read_text()


def test_attached_process_has_no_exit_status_none(tmp_path):
    live = start_ready([prog("live_calls", "O0-pie")])
    try:
        directory = str(tmp_path / "attached")
        result = madtrace("attach", "-q", "--data", "--no-functions", "--duration", "0.5",
                          "-o", directory, str(live.pid), timeout=120)
        if result.returncode == 77:
            pytest.skip(result.stderr.decode().strip())
        assert result.returncode == 0, result.stderr
    finally:
        live.stdin.close()
        try:
            live.wait(timeout=60)
        except subprocess.TimeoutExpired:
            live.kill()
    meta = json.load(open(os.path.join(directory, "meta.json")))
    assert meta["exit_status"] is None and meta["mode"] == "attach"
    out = tmp_path / "attached.html"
    result = madtrace("report", directory, "--html", str(out))
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "None" not in re.sub(r"<script.*?</script>", "", text, flags=re.S)
    assert re.search(r'data-metric="ended" data-v="detached \(duration\), the process kept running"',
                     text)
    assert f"attached to pid {live.pid}" in text


def test_page_script_is_inline_and_parses(tmp_path):
    assert "</script" not in SCRIPT and "http" not in SCRIPT
    if shutil.which("node"):
        (tmp_path / "page.js").write_text(SCRIPT)
        check = subprocess.run(["node", "--check", str(tmp_path / "page.js")], capture_output=True,
                               text=True)
        assert check.returncode == 0, check.stderr


def test_png_heat_map_one_row_per_region_without_access_and_folds(tmp_path):
    import numpy as np
    from PIL import Image

    from madtrace.analysis.heatmap import Heatmap, HeatRegion
    from madtrace.report import png
    page = 4096
    sparse = HeatRegion("[anon 0x7f0000000000] " + "a very long label " * 6, 0x7F0000000000,
                        0x7F0000000000 + 16384 * page, True, cell_pages=4,
                        counts=np.zeros((16384, 3), dtype=np.int64))
    sparse.counts[1] = [5, 2, 0]                                  # cell 0: the first row
    untraced = HeatRegion("[anon 0x7f1000000000]", 0x7F1000000000, 0x7F1000000000 + 2048 * page,
                          False)
    idle = HeatRegion(".bss of " + "x" * 120, 0x7F2000000000, 0x7F2000000000 + 300 * page, True,
                      counts=np.zeros((300, 3), dtype=np.int64))
    model = Heatmap("synthetic", [sparse, untraced, idle], {"loads": 5, "stores": 2})
    boxes, height = png.layout(model)
    assert [b.rows for b in boxes] == [2, 1, 1]          # 64 rows: 1 + 63 folded; one line each
    assert boxes[0].folds == [(1, 63)]
    out = tmp_path / "heat.png"
    assert png.write_heatmap_png(model, str(out)) == (png.WIDTH, height)
    image = np.asarray(Image.open(out).convert("RGB")).astype(int)
    assert image.shape == (height, png.WIDTH, 3) and height < 200

    def colour(box, k):
        x, y = png.cell_origin(box, k)
        return tuple(image[y + 3, x + 3])
    r, g, b = colour(boxes[0], 0)
    assert r > b + 40                                    # the accessed cell, in colour
    pale = tuple(round(255 * c) for c in png.UNTOUCHED)
    assert colour(boxes[0], 64 * 40) == pytest.approx(pale, abs=2)   # a folded cell
    assert colour(boxes[1], 0) == pytest.approx(tuple(round(255 * c) for c in png.GREY), abs=2)
    # the long labels end before the grid's column (where each region's address starts)
    for box in boxes:
        band = image[box.top - png.GAP:box.top, png.GRID_X - 11:png.GRID_X - 1]
        assert (band < 250).sum() == 0
        assert (image[box.top - png.GAP:box.top, png.GRID_X:png.GRID_X + 60] < 200).any()
