"""The course as a reader sees it, in a real browser (Debian's Chromium driven by Playwright):

- the docs site: every page opens, no internal link is broken, no anchor is missing, every image loads, nothing is
  fetched from outside the machine, and every step widget plays without a kernel (moving its slider or pressing
  play changes the picture) — the lessons of the block manager, the scheduler and the engine must have one;
- JupyterLab: one lesson opened in a real JupyterLab, run top to bottom, and its step widget's slider moved.

The site is built by `.ci/docs` (about 15 s). Chromium comes from Debian (`apt-get install chromium`, done by `.ci/run`).
"""
import contextlib, functools, http.server, os, re, shutil, socket, subprocess, threading, time
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlparse, unquote
import pytest

ROOT = Path(__file__).resolve().parent.parent
# .ci/run builds this checkout's site with .ci/docs just before the tests and names it here: the tests read that
# one; otherwise a private build per test process (nothing else in the test run rebuilds or deletes either)
PREBUILT = Path(os.environ.get("MINIVLLM_SITE_PREBUILT") or "/nonexistent")
SITE = PREBUILT if (PREBUILT / "index.html").exists() else \
    ROOT / ".pytest_cache" / f"site-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [pytest.mark.xdist_group("browser"),
              pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium; .ci/run installs it)")]
MUST_HAVE_VIEWERS = ["block_manager", "scheduler", "llm_engine"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); return s.getsockname()[1]


@pytest.fixture(scope="session")
def site():
    """Build the site (once per test process; not when .ci/run has just built it, PREBUILT), serve it on a
    loopback port; yields the base URL."""
    if SITE != PREBUILT:
        for attempt in range(2):    # .ci/docs takes a lock; a second try covers a build that something else disturbed
            r = subprocess.run(["bash", ".ci/docs"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, MINIVLLM_SITE_DIR=str(SITE)))
            if r.returncode == 0: break
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *a): pass
    handler = functools.partial(Quiet, directory=str(SITE))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


@pytest.fixture(scope="module")
def browser():
    "Chromium, for this module's tests only: playwright's sync API keeps an event loop running in this thread while it is open."
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


class _Links(HTMLParser):
    def __init__(self):
        super().__init__(); self.ids, self.hrefs, self.srcs = set(), [], []
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"): self.ids.add(a["id"])
        if tag == "a" and a.get("href"): self.hrefs.append(a["href"])
        if tag == "img" and a.get("src"): self.srcs.append(a["src"])


@functools.lru_cache(maxsize=None)
def parse(page: str) -> _Links:
    p = _Links(); p.feed((SITE / page).read_text(encoding="utf-8")); return p


def pages() -> list[str]:
    return sorted(p.name for p in SITE.glob("*.html"))


def test_every_code_block_renders_as_code(site):
    "A fold summary Quarto cannot parse (a backtick in it) turns its code block into paragraphs of text: none does."
    bad = [page for page in pages() if "code-fold=\u201ctrue\u201d" in (SITE / page).read_text()]
    assert not bad, bad


PLACEHOLDERS = re.compile(r"Call self as a function|Return repr\(self\)|Initialize self\.  See help|"
                          r"&lt;function __main__\.|&lt;[\w.]+ object at 0x[0-9a-f]+&gt;")


def test_no_placeholder_docstrings_or_bare_reprs(site):
    """No page shows Python's placeholder docstrings (a method without a docstring of its own) or a cell's bare
    object repr (`<function __main__.f …>`, `<… object at 0x…>`)."""
    bad = [f"{page}: {m}" for page in pages() for m in sorted(set(PLACEHOLDERS.findall((SITE / page).read_text())))]
    assert not bad, bad


def test_links_anchors_images(site):
    "Every internal link reaches a page that exists and, with a #fragment, an element with that id."
    bad = []
    for page in pages():
        for href in parse(page).hrefs:
            u = urlparse(href)
            if u.scheme or href.startswith("//") or href.startswith("mailto:"): continue   # external: not followed
            target = page if not u.path else os.path.normpath(os.path.join(os.path.dirname(page), unquote(u.path)))
            if target.endswith("/"): target += "index.html"
            if not (SITE / target).exists(): bad.append(f"{page}: {href} (no file {target})"); continue
            if u.fragment and target.endswith(".html") and unquote(u.fragment) not in parse(target).ids:
                bad.append(f"{page}: {href} (no anchor #{u.fragment} in {target})")
        for src in parse(page).srcs:
            if src.startswith("data:") or urlparse(src).scheme: continue
            if not (SITE / os.path.normpath(os.path.join(os.path.dirname(page), unquote(urlparse(src).path)))).exists():
                bad.append(f"{page}: image {src} missing")
    assert not bad, "\n".join(bad)


SIDEWAYS = """() => [...document.querySelectorAll('main pre, main div.sourceCode, main .cell-output, main table')]
    .filter(e => e.offsetParent !== null && e.scrollWidth > e.clientWidth + 1)
    .map(e => e.tagName + ' ' + e.scrollWidth + '>' + e.clientWidth + ': ' + e.textContent.slice(0, 50))"""
BROKEN_IMAGES = "[...document.images].filter(i => i.complete && i.naturalWidth === 0).map(i => i.src.slice(0, 80))"
FRAME_HEIGHTS = "() => [...document.querySelectorAll('.step-viewer img.sv-frame')].map(i => i.getBoundingClientRect().height)"


def play_widgets(pg, page) -> tuple[int, list[str]]:
    "Move each step widget's slider, press next and play: how many widgets the page has, and what did not work."
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    n, bad = pg.locator(".step-viewer").count(), []
    for k in range(n):
        v = pg.locator(".step-viewer").nth(k)
        img, slider = v.locator("img.sv-frame"), v.locator("input.sv-slider")
        if int(slider.get_attribute("max")) == 0: continue
        before = img.get_attribute("src")
        slider.evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
        at0 = img.get_attribute("src")
        if at0 == before: bad.append(f"{page}: viewer {k}: moving the slider did not change the picture")
        v.locator(".sv-next").click()
        if img.get_attribute("src") == at0: bad.append(f"{page}: viewer {k}: the next button did not change the picture")
        slider.evaluate("(s) => { s.value = 0; s.dispatchEvent(new Event('input')); }")
        v.locator(".sv-play").click()
        try:   # the player shows the next frame after its interval (700 ms); wait for that, 5 s at most
            pg.wait_for_function("(s) => +s.value > 0", arg=slider.element_handle(), timeout=5000)
        except PlaywrightTimeout:
            bad.append(f"{page}: viewer {k}: play did not advance")
        v.locator(".sv-play").click()   # pause again (or no-op once it reached the end)
    return n, bad


@pytest.fixture(scope="module")
def sweep(site, browser):
    """Every page opened once in Chromium at 1400x900 (what the tests below check, read off that one load): failed
    requests, requests off this machine, script errors, undecoded images, blocks that scroll sideways, step widgets'
    frame heights, then each widget played."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 900})
    seen = {"outside": [], "failed": [], "errors": []}
    ctx.route(re.compile(r"^(?!http://127\.0\.0\.1)(?!data:)(?!blob:)(?!about:).*"),
              lambda route: (seen["outside"].append(route.request.url), route.abort()))
    pg = ctx.new_page()
    pg.on("requestfailed", lambda r: seen["failed"].append(r.url))
    pg.on("pageerror", lambda e: seen["errors"].append(str(e)))
    out = {}
    for page in pages():
        for v in seen.values(): v.clear()
        pg.goto(f"{site}/{page}", wait_until="load")
        r = dict(broken=pg.evaluate(BROKEN_IMAGES), sideways=pg.evaluate(SIDEWAYS), frames=pg.evaluate(FRAME_HEIGHTS))
        r["widgets"], r["widget_problems"] = play_widgets(pg, page)
        out[page] = r | {k: list(v) for k, v in seen.items()}
    ctx.close()
    return out


def test_pages_in_browser(sweep):
    "Each page loads in Chromium with no failed request, no request off this machine, and every image decoded."
    problems = []
    for page, r in sweep.items():
        problems += [f"{page}: script error {e}" for e in r["errors"]]
        problems += [f"{page}: image did not load: {s}" for s in r["broken"]]
        problems += [f"{page}: fetched from outside the machine: {u}" for u in r["outside"]]
        problems += [f"{page}: request failed: {u}" for u in r["failed"] if u not in r["outside"]]
    assert not problems, "\n".join(problems)


def test_step_widgets_play_without_kernel(sweep):
    "Every step widget on the site changes its picture when its slider moves and when play is pressed."
    assert not (bad := [b for r in sweep.values() for b in r["widget_problems"]]), "\n".join(bad)
    missing = [p for p in MUST_HAVE_VIEWERS if not sweep.get(p + ".html", {}).get("widgets")]
    assert not missing, f"no step widget on: {missing}"


# ---- the site as a course: the code on the page, nothing scrolls sideways, the two paths in the sidebar

import ast, json, runpy


def core_lessons() -> list[dict]:
    return runpy.run_path(str(ROOT / ".ci" / "reading_time"))["course"]()["core"]


def taught_names(nb_file: str) -> list[tuple[str, bool]]:
    """The public functions and classes a lesson exports: what the page must show as code, each with
    whether its author folds it as a helper (`#| fold`: a test fixture, a timer, a GPU-only path)."""
    names = []
    for c in json.loads((ROOT / "nbs" / nb_file).read_text())["cells"]:
        src = "".join(c["source"])
        if c["cell_type"] != "code" or not re.search(r"^#\|\s*export\s*$", src, re.M): continue
        try: tree = ast.parse("\n".join(l for l in src.splitlines() if not l.startswith(("%", "!"))))
        except SyntaxError: continue
        folded = bool(re.search(r"^#\|\s*fold\b", src, re.M))
        names += [(n.name, folded) for n in tree.body
                  if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and not n.name.startswith("_")]
    return names


def page_of(stem: str) -> str:
    return re.sub(r"^\d+[a-z]?_", "", stem) + ".html"


VISIBLE_CODE = """() => [...document.querySelectorAll('main pre.sourceCode')]
    .filter(p => p.offsetParent !== null).map(p => p.innerText).join('\\n')"""
# every code block, folded ones too (a folded block's text is in the page, one click away)
ALL_CODE = """() => [...document.querySelectorAll('main pre.sourceCode')].map(p => p.textContent).join('\\n')"""


def test_core_pages_show_their_code(site, browser):
    """Every public function and class a core lesson exports shows its source on its page: unfolded,
    or folded where its author marks it a helper (`#| fold`). Helpers stay few: at most 4 a lesson."""
    pg = browser.new_page(viewport={"width": 1400, "height": 900})
    missing, helpers = [], {}
    for e in core_lessons():
        pg.goto(f"{site}/{page_of(e['nb'])}", wait_until="load")
        shown, every = pg.evaluate(VISIBLE_CODE), pg.evaluate(ALL_CODE)
        names = taught_names(e["file"])
        helpers[e["nb"]] = [n for n, folded in names if folded]
        missing += [f"{e['nb']}: {n}" for n, folded in names
                    if not re.search(rf"^\s*(def|class) {re.escape(n)}\b", every if folded else shown, re.M)]
    pg.close()
    assert not missing, "exported but not shown as code on the page:\n" + "\n".join(missing)
    assert all(len(h) <= 4 for h in helpers.values()), f"folded public helpers: {helpers}"


def test_nothing_scrolls_sideways(site, browser, sweep):
    "At a 1400 px window no code block, output or table on any page scrolls sideways, and 100 columns of code fit a line."
    bad = [f"{page}: {x}" for page, r in sweep.items() for x in r["sideways"]]
    pg = browser.new_page(viewport={"width": 1400, "height": 900})
    pg.goto(f"{site}/scheduler.html", wait_until="load")
    fits = pg.evaluate("""() => { const pre = document.querySelector('main pre.sourceCode');
        const s = document.createElement('span'); s.textContent = '0'.repeat(100); s.style.whiteSpace = 'pre';
        pre.querySelector('code').appendChild(s);
        const cs = getComputedStyle(pre);
        return s.getBoundingClientRect().width <= pre.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) + 1; }""")
    pg.close()
    assert fits, "a line of 100 columns of code does not fit the text column"
    assert not bad, "\n".join(bad)


# every matplotlib picture of a page: the figures in cell outputs as shown, and every frame of each step widget (the
# player shows one at a time, at most the widget's inner width)
FIGURE_WIDTHS = """async () => {
    const out = [];
    for (const i of document.querySelectorAll('main .cell-output-display img:not(.sv-frame)'))
        if (i.offsetParent !== null && i.naturalWidth) out.push(['figure', i.clientWidth, i.naturalWidth]);
    for (const v of document.querySelectorAll('main .step-viewer')) {
        if (v.offsetParent === null) continue;
        const cs = getComputedStyle(v), room = v.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight);
        for (const [step, png] of JSON.parse(v.querySelector('script.sv-frames').textContent)) {
            const im = new Image(); im.src = 'data:image/png;base64,' + png; await im.decode();
            out.push([`step widget frame (step ${step})`, Math.min(room, im.naturalWidth), im.naturalWidth]);
        }
    }
    return out; }"""


def test_core_figures_are_not_scaled_down(site, browser):
    """At a 1280 px window (a text column about 748 px wide) every figure and step-widget frame of a core lesson is
    shown at 0.9 of the width it was drawn at or more: one drawn wider than the column is scaled down, its text with
    it (an 8 pt label drawn at 100 dpi is 11 px tall; scaled to 0.8, under 9)."""
    pg = browser.new_page(viewport={"width": 1280, "height": 900})
    bad, seen = [], 0
    for e in core_lessons():
        pg.goto(f"{site}/{page_of(e['nb'])}", wait_until="load")
        for k, (what, shown, natural) in enumerate(pg.evaluate(FIGURE_WIDTHS)):
            seen += 1
            if shown < 0.9 * natural:
                bad.append(f"{e['nb']}: {what} #{k} drawn {natural} px wide, shown {shown} px ({shown / natural:.2f})")
    pg.close()
    assert seen, "no figure on the core pages"
    assert not bad, "\n".join(bad)


def test_step_widget_frames_fit_the_screen(sweep):
    "A step widget's frame is at most 700 px tall: the slider and the picture fit on one screen."
    tall = [f"{page}: frame {k} is {h:.0f} px tall" for page, r in sweep.items() for k, h in enumerate(r["frames"]) if h > 700]
    assert not tall, "\n".join(tall)


def test_no_link_to_a_repository_that_does_not_exist(site):
    "Pages link no source repository of the project's own (there is none published): the code is on the page."
    import configparser
    cfg = configparser.ConfigParser(); cfg.read(ROOT / "settings.ini")
    repo = cfg["DEFAULT"].get("git_url", "").rstrip("/")
    bad = [f"{page}: {h}" for page in pages() for h in parse(page).hrefs if repo and h.startswith(repo)]
    assert not bad, "\n".join(bad[:20])


PAGE_COUNTS = """() => {
    const ref = e => e.closest('section[id^="reference"]');   // a "Reference: ..." section is not read
    const shown = [...document.querySelectorAll('main pre.sourceCode')].filter(p => p.offsetParent !== null && !ref(p));
    const lines = shown.map(p => p.innerText.split('\\n').filter(l => l.trim()).length).reduce((a, b) => a + b, 0);
    const prose = document.querySelector('main').cloneNode(true);
    prose.querySelectorAll('pre, script, style, .cell-output, .cell-output-display, details, .step-viewer, '
                           + 'section[id^="reference"]').forEach(e => e.remove());
    const words = prose.innerText.split(/\\s+/).filter(w => w).length;
    const widgets = [...document.querySelectorAll('main .step-viewer, main .widget-static')].filter(w => !ref(w));
    return [words, lines, widgets.length]; }"""


def test_core_path_reading_time_from_the_built_pages(site, browser):
    """The core path read off the built pages (prose words, code lines a reader sees unfolded, widgets, none of a
    "Reference: ..." section; the rates of .ci/reading_time) takes at most its limit (3 h 30 min), and each lesson
    within 2 minutes of the time the sidebar shows."""
    rt = runpy.run_path(str(ROOT / ".ci" / "reading_time"))
    pg = browser.new_page(viewport={"width": 1400, "height": 900})
    total, off = 0.0, []
    for e in core_lessons():
        pg.goto(f"{site}/{page_of(e['nb'])}", wait_until="load")
        words, lines, widgets = pg.evaluate(PAGE_COUNTS)
        m = words / rt["WORDS_PER_MIN"] + lines / rt["LINES_PER_MIN"] + rt["MIN_PER_WIDGET"] * widgets
        total += m
        if abs(m - e["minutes"]) > 2: off.append(f"{e['nb']}: {m:.1f} min on the page, {e['minutes']} in the sidebar")
    pg.close()
    assert not off, "\n".join(off)
    assert total <= rt["CORE_LIMIT_MIN"], f"the core path's pages take {total:.0f} min to read"


def test_sidebar_has_the_two_paths(site, browser):
    "The sidebar has a core path and a going-further section, each lesson with its number and reading time."
    pg = browser.new_page()
    pg.goto(f"{site}/index.html", wait_until="load")
    sections = pg.evaluate("() => [...document.querySelectorAll('#quarto-sidebar .sidebar-item-section')].map(s => s.innerText)")
    pg.close()
    core = [s for s in sections if s.startswith("Core path")]
    further = [s for s in sections if s.startswith("Going further")]
    assert core and further, f"sidebar sections: {[s.splitlines()[0] for s in sections]}"
    for e in core_lessons():
        assert re.search(rf"{e['number']} · .*\d+ (min|h)", core[0]), f"{e['nb']} is not in the core path with its time"


@contextlib.contextmanager
def jupyter_lab(port: int, root: Path):
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(root / ".jupyter"), HF_HUB_OFFLINE="1")
    cmd = ["jupyter", "lab", "--no-browser", "--allow-root", f"--port={port}", "--ip=127.0.0.1",
           "--IdentityProvider.token=", "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True",
           f"--ServerApp.root_dir={root}", "--LabApp.news_url=None", "--LabServerApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    import httpx
    deadline = time.time() + 120
    try:
        while True:
            assert proc.poll() is None, "jupyter lab exited: " + proc.stderr.read()[-3000:]
            assert time.time() < deadline, "jupyter lab did not start"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/status", timeout=2).status_code == 200: break
            except httpx.HTTPError: time.sleep(0.5)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try: proc.wait(timeout=20)
        except subprocess.TimeoutExpired: proc.kill()


LAB_LESSON = "nbs/90_viz.ipynb"   # the drawing lesson: quick to run (seconds), so a loaded CI machine does not time out


def test_lesson_in_jupyterlab(browser, tmp_path):
    "Open a lesson in a real JupyterLab, run all its cells, then move its step widget's slider: the frame changes."
    copy = tmp_path / Path(LAB_LESSON).name      # run a copy in a scratch folder: the saved lesson stays as it is
    shutil.copy(ROOT / LAB_LESSON, copy)
    with jupyter_lab(free_port(), tmp_path) as base:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            pg.goto(f"{base}/lab/tree/{copy.name}?reset", wait_until="load")
            pg.wait_for_selector(".jp-Notebook", timeout=60_000)
            pg.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
            pg.locator(".jp-Cell").first.click()      # focus the notebook, as a reader clicking into it
            # Kernel > Restart Kernel and Run All Cells, through the menu as a reader would (once more if nothing started)
            for attempt in range(3):
                pg.get_by_role("menuitem", name="Kernel", exact=True).click()
                pg.get_by_text("Restart Kernel and Run All Cells…", exact=True).click()
                pg.locator(".jp-Dialog .jp-mod-accept").click()
                try:
                    pg.wait_for_function("() => [...document.querySelectorAll('.jp-InputArea-prompt')].some(p => /\\[\\d+\\]/.test(p.textContent))",
                                         timeout=120_000)
                    break
                except Exception:
                    if attempt == 2: raise
            pg.locator(".widget-slider").last.wait_for(timeout=300_000)
            img = pg.locator("img.widget-image").last
            img.wait_for(timeout=60_000)
            pg.wait_for_function("() => [...document.querySelectorAll('img.widget-image')].every(i => i.src)", timeout=30_000)
            before = img.get_attribute("src")
            pg.locator(".widget-slider .noUi-handle").last.focus()
            pg.keyboard.press("Home")        # noUiSlider: to the first frame
            pg.wait_for_function("(b) => { const i = [...document.querySelectorAll('img.widget-image')].pop(); return i && i.src !== b; }",
                                 arg=before, timeout=30_000)
            tracebacks = pg.locator(".jp-OutputArea-output:has-text('Traceback')").count()
            assert tracebacks == 0, "the lesson raised in JupyterLab"
        except Exception:
            shot = ROOT / ".pytest_cache" / "jupyterlab-failure.png"
            shot.parent.mkdir(exist_ok=True); pg.screenshot(path=str(shot))
            print(f"screenshot of the failure: {shot}")
            raise
        finally: pg.close()
