"""The built site in a real browser: at 1280 px every table fits the page and no name in a table breaks mid-word.

Headless Chromium (Debian's `chromium` and `chromium-driver`, driven by selenium) opens the built API
reference pages that have tables, the command line page and the Accelerate compatibility page at a
1280 px wide viewport and measures the DOM: each table's right edge against the content column's, and,
for every `code` element in a table that spans lines, the characters on either side of each line break
(letters, digits, "_" or "-" on both sides: the break splits a word). A screenshot of each page,
scrolled to its widest table, goes to `ACCEL_DOCS_SHOTS` as evidence.

`nox -s docs` builds the site, installs the browser and runs this file with `ACCEL_DOCS_SITE` set to the
built site; without that variable (a plain `pytest docs`) it skips.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

SITE = os.environ.get("ACCEL_DOCS_SITE")
pytestmark = pytest.mark.skipif(not SITE, reason="ACCEL_DOCS_SITE (a built site) is unset; `nox -s docs` sets it")

WIDTH, HEIGHT = 1280, 900


def pages() -> list[str]:
    """Every API reference page with a table (the parameter tables), and the pages whose tables hold long
    flags and class names."""
    api = []
    if SITE:
        built = Path(SITE).resolve()
        found = (p for p in sorted((built / "api").glob("*/index.html")) if "<table" in p.read_text())
        api = [p.parent.relative_to(built).as_posix() for p in found]
    return [*api, "cli", "accelerate_compat"]


# Runs in the page: a list of findings, each one a table that overflows or a name broken mid-word.
MEASURE = """
const content = document.querySelector("article.md-content__inner").getBoundingClientRect();
const right = Math.min(content.right, document.documentElement.clientWidth);
const found = [];
let widest = null;
document.querySelectorAll("article.md-content__inner table").forEach((table, index) => {
  const box = table.getBoundingClientRect();
  const headers = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  if (!widest || box.width > widest.getBoundingClientRect().width) widest = table;
  if (box.right > right + 0.5) {
    found.push({kind: "overflow", table: index, headers: headers.join(" | "),
                table_right: Math.round(box.right), content_right: Math.round(right)});
  }
  table.querySelectorAll("td code, th code").forEach((code) => {
    const text = code.textContent;
    if (code.getClientRects().length < 2) return;
    // One character at a time: a change of line top between two neighbours is a break.
    const walker = document.createTreeWalker(code, NodeFilter.SHOW_TEXT);
    const chars = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (let i = 0; i < node.length; i++) {
        const range = document.createRange();
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rect = [...range.getClientRects()].find((r) => r.width > 0);
        chars.push({ch: node.data[i], top: rect ? rect.top : null, at: chars.length});
      }
    }
    const visible = chars.filter((c) => c.top !== null);
    for (let i = 1; i < visible.length; i++) {
      const before = visible[i - 1], after = visible[i];
      // Inside a word: letters, digits, "_" and "-" on both sides of the break (`DDPCommunicatio nHookType`,
      // `--nproc_per_nod e`, `accel- base`). After a space or ". , ( = / |" a name may go on on the next line.
      const between = chars.slice(before.at, after.at + 1).map((c) => c.ch).join("");
      if (after.top > before.top + 1 && /^[\\w-]+$/.test(between)) {
        const at = after.at;
        found.push({kind: "mid-word", table: index, name: text,
                    broken: text.slice(0, at) + " / " + text.slice(at)});
      }
    }
  });
});
if (widest) widest.scrollIntoView({block: "start"});
return found;
"""


def _browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    assert chromium and driver, "install Debian's chromium and chromium-driver (`nox -s docs` does, as root)"
    return chromium, driver


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = _browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--hide-scrollbars"):
        options.add_argument(flag)
    options.add_argument(f"--window-size={WIDTH},{HEIGHT}")
    chrome = webdriver.Chrome(service=Service(executable_path=driver), options=options)
    # The layout viewport exactly WIDTH wide, whatever the window decorations take.
    metrics = {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False}
    chrome.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
    yield chrome
    chrome.quit()


@pytest.mark.parametrize("page", pages())
def test_tables_fit_at_1280px_and_names_break_only_between_words(browser: Any, page: str) -> None:
    assert SITE is not None
    index = Path(SITE).resolve() / page / "index.html"
    assert index.is_file(), f"{index} is missing: build the site first (mkdocs build)"
    browser.get(index.as_uri())
    assert browser.execute_script("return document.querySelectorAll('article table').length") > 0, (
        f"{page} has no table left to check: pick another page in pages()"
    )
    found = browser.execute_script(MEASURE)
    shots = os.environ.get("ACCEL_DOCS_SHOTS")
    if shots:
        Path(shots).mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(Path(shots) / f"{page.replace('/', '-')}.png"))
    overflow = [f for f in found if f["kind"] == "overflow"]
    broken = sorted({f["broken"] for f in found if f["kind"] == "mid-word"})
    assert not overflow, f"{page}: {len(overflow)} table(s) wider than the page at {WIDTH} px: {overflow[:5]}"
    assert not broken, f"{page}: {len(broken)} name(s) in tables broken mid-word (' / ' marks the break): {broken[:10]}"
