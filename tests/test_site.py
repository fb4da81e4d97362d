"""The documentation site in a real browser, as tests/test_report.py checks the report page: built with
`mkdocs build --strict`, served over HTTP, every page opened in headless Chromium (Debian's chromium and
chromedriver, driven by Selenium). A page fails on a console error, a link to the site that leads nowhere (its
file, or the #fragment on it, is missing) or an image that does not load.

The test runs offline, so a resource of another origin cannot load here: a network failure of a URL outside the
site is left out, and only that (mkdocs-material fetches its fonts from Google unless mkdocs.yml says
`theme.font: false`); everything the site serves itself must load.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
import time
from html.parser import HTMLParser
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlsplit

import pytest

from tests.browser import chromium, require_chromium
from tests.site_build import the_strict_site

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                reason="mkdocs is not installed: pip install -e '.[docs]'")
SKIPPED = ("search", "404.html")  # the search plugin's assets and the not-found page are not pages of the site
LOADED_SECONDS = 10  # for a page's images to load once it is open


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # one line per request on stderr otherwise
        pass


class served:
    """`folder` over HTTP on a free port of 127.0.0.1, in a thread, while the `with` lasts; its URL is `url`."""

    def __init__(self, folder: Path):
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(value for name, value in attrs if name in ("id", "name") and value)


@functools.cache
def ids_of(page: Path) -> frozenset[str]:
    parser = _Ids()
    parser.feed(page.read_text(errors="replace"))
    return frozenset(parser.ids)


def target_of(url: str, base: str, site: Path) -> Path:
    """The file of the site that a URL of its own origin names (a folder's index.html for a folder)."""
    path = unquote(urlsplit(url).path)[len(urlsplit(base).path):]
    return site / path / "index.html" if path == "" or path.endswith("/") or (site / path).is_dir() else site / path


def external_network_failure(entry: dict, base: str) -> bool:
    """A console entry that says only that a resource of another origin could not be fetched (offline here)."""
    message = entry["message"]
    url = message.split(" ", 1)[0]
    return "net::ERR_" in message and url.startswith(("http://", "https://")) and not url.startswith(base)


def problems_of(browser, url: str, base: str, site: Path) -> list[str]:
    """What is wrong with the page at `url`: console errors, broken links to the site, images that did not load."""
    browser.get(url)
    # lazy images load only when scrolled to: ask for all of them now, and give them time to arrive
    browser.execute_script("document.querySelectorAll('img[loading=lazy]').forEach(i => i.loading = 'eager')")
    deadline = time.monotonic() + LOADED_SECONDS
    while time.monotonic() < deadline and not browser.execute_script(
            "return Array.from(document.images).every(i => i.complete)"):
        time.sleep(0.1)
    found = [f"console: {e['message']}" for e in browser.get_log("browser")
             if e["level"] == "SEVERE" and not external_network_failure(e, base)]
    found += [f"image does not load: {src}" for src in browser.execute_script(
        "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.currentSrc || i.src || i.outerHTML)")]
    for href in sorted(set(browser.execute_script(
            "return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"))):
        if not href.startswith(base):
            continue  # another site: offline here, not checked
        address, fragment = urldefrag(href)
        target = target_of(address, base, site)
        if not target.is_file():
            found.append(f"broken link: {href} (no {target.relative_to(site)})")
        elif fragment and target.suffix == ".html" and unquote(fragment) not in ids_of(target):
            found.append(f"broken link: {href} (no id {unquote(fragment)!r} on {target.relative_to(site)})")
    return found


def pages_of(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("index.html") if p.relative_to(site).parts[0] not in SKIPPED)


def check_site(site: Path) -> tuple[dict[str, list[str]], int]:
    """Each page's problems (only pages that have some), and how many pages were opened."""
    pages = pages_of(site)
    browser = chromium(offline=True)
    try:
        with served(site) as server:
            found = {}
            for page in pages:
                relative = page.parent.relative_to(site).as_posix()
                url = server.url + ("" if relative == "." else relative + "/")
                problems = problems_of(browser, url, server.url, site)
                if problems:
                    found[relative] = problems
    finally:
        browser.quit()
    return found, len(pages)


def test_every_page_of_the_site_loads_cleanly_in_a_browser(tmp_path_factory):
    require_chromium()  # before the build (12-15 s), not after it
    built = the_strict_site(tmp_path_factory)  # tests/test_docs.py reads the same build
    assert built.returncode == 0, built.stderr[-3000:]
    found, opened = check_site(built.site)
    assert opened >= 10, f"only {opened} pages built"
    assert not found, "\n".join(f"{page}: {problem}" for page, problems in found.items() for problem in problems)


PAGES = {
    "index.html": """<!doctype html><html><head><title>home</title><link rel="icon" href="data:,"></head><body>
        <h1 id="top">home</h1>
        <a href="good/">good</a> <a href="good/#here">here</a> <a href="#top">top</a>
        <a href="good/#nowhere">a missing fragment</a> <a href="missing/">a missing page</a>
        <a href="https://example.invalid/">another site</a>
        <img src="pixel.gif" alt="loads"> <img src="missing.png" alt="does not load" loading="lazy">
        <script>console.error("a page error")</script>
        <link rel="stylesheet" href="https://example.invalid/font.css">
        </body></html>""",
    "good/index.html": '<!doctype html><html><head><title>good</title><link rel="icon" href="data:,"></head>'
                       '<body><p id="here">x</p></body></html>',
}
PIXEL = bytes.fromhex("47494638396101000100800000000000ffffff21f90401000000002c00000000010001000002024401003b")


def test_the_checks_fail_on_a_site_with_each_problem(tmp_path):
    for name, text in PAGES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "pixel.gif").write_bytes(PIXEL)
    found, opened = check_site(tmp_path)
    assert opened == 2 and list(found) == ["."], found
    problems = found["."]
    assert any(p.startswith("console: ") and "a page error" in p for p in problems), problems
    assert any(p.startswith("console: ") and "missing.png" in p for p in problems), problems  # the 404
    assert any(p.startswith("image does not load: ") and p.endswith("/missing.png") for p in problems), problems
    assert any(p.startswith("broken link: ") and "no id 'nowhere' on good/index.html" in p for p in problems)
    assert any(p.startswith("broken link: ") and "missing/ (no missing/index.html)" in p for p in problems)
    assert len(problems) == 5, problems  # the other site's stylesheet and link, offline, are not the site's fault
