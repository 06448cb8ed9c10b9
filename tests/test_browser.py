"""A real browser opens a report built from hostile model output: nothing may run, everything must read as text.

Headless Chromium (Debian's `chromium`, installed by `.ci/run`) loads the page from disk; `--dump-dom`
returns the DOM after load, so a payload that ran would show as a changed title, an added element or
attribute. A control page with a real script proves the browser runs JavaScript at all, so "no script
ran" is not vacuous. The DOM check runs on the report with its Content-Security-Policy removed, so
autoescaping alone must hold; the screenshot is of the report as shipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from repro.procs.process import ManagedProcess
from repro.report import render_report
from run_builders import SENTINEL, make_run, run_main

pytestmark = pytest.mark.slow

HOSTILE = (
    "Sure.</pre></mark><script>document.title='PWNED-SCRIPT'</script>\n"
    "<img src=x onerror=\"document.body.setAttribute('data-pwned','img')\">\n"
    "<a href=\"javascript:document.title='PWNED-LINK'\">click me</a>\n"
    f"<{SENTINEL}tool_calls>\n<{SENTINEL}invoke name=\"x\"></script><script>document.body.innerHTML='WIPED'</script>\n"
    "<svg onload=\"document.body.appendChild(document.createElement('pwned-svg'))\"></svg>\n"
    "<meta http-equiv=\"refresh\" content=\"0;url=javascript:document.title='PWNED-META'\">\n"
    "<style>body{display:none}</style>"
)
HOSTILE_NAME = "run<b onmouseover=alert(1)>&amp;"
TIMEOUT_S = 150.0
"""One headless Chromium run: it does the same work at any load, only slower on a loaded machine."""


class Dom(HTMLParser):
    """The elements, attributes and text of a dumped DOM."""

    def __init__(self, markup: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self._in_title = False
        self.title = ""
        self.feed(markup)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_title = tag == "title"

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        self.text.append(data)


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed: the browser test needs it (`apt-get install chromium`; .ci/run does)")
    return found


def browse(url: str, profile: Path, *mode: str, height: int = 1400, width: int = 1280) -> str:
    """Run headless Chromium once on `url` in its own process group; its stdout (the DOM for --dump-dom)."""
    argv = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", f"--user-data-dir={profile}", f"--window-size={width},{height}", *mode, url,
    ]
    popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    browser = ManagedProcess(popen, argv, None)
    try:
        out, _ = popen.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"chromium did not finish within {TIMEOUT_S:g}s on {url}")
    finally:
        browser.stop(timeout=5.0)  # the renderer and zygote children outlive the leader otherwise
    assert popen.returncode == 0, f"chromium exited with {popen.returncode}"
    return out.decode("utf-8", errors="replace")


def test_hostile_model_output_is_shown_as_text_and_never_runs(tmp_path: Path) -> None:
    browser_ok = tmp_path / "control.html"
    browser_ok.write_text("<html><head><title>before</title></head><body>"
                          "<script>document.title='SCRIPT-RAN'</script></body></html>", encoding="utf-8")
    assert "<title>SCRIPT-RAN</title>" in browse(browser_ok.as_uri(), tmp_path / "p0", "--dump-dom")

    run = make_run(tmp_path / "run", name=HOSTILE_NAME, clean=3, corrupt=2, leak=HOSTILE, task=HOSTILE[:80])
    report = render_report([run], tmp_path / "report.html").html
    html = report.read_text(encoding="utf-8")
    # The shipped page forbids scripts by policy; the check below removes the policy, so escaping alone must hold.
    csp = '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; img-src data:;'
    assert html.count(csp) == 1
    no_csp = tmp_path / "report-no-csp.html"
    no_csp.write_text(html.replace(csp, '<meta name="csp-removed" content="'), encoding="utf-8")

    dom = Dom(browse(no_csp.as_uri(), tmp_path / "p1", "--dump-dom"))
    assert dom.title == f"repro report: {HOSTILE_NAME}", f"the title changed: {dom.title!r}"
    names = [tag for tag, _ in dom.tags]
    for forbidden in ("script", "svg", "pwned-svg", "a", "b", "iframe"):
        assert forbidden not in names, f"hostile <{forbidden}> became an element"
    assert names.count("style") == 1 and names.count("meta") == 3
    for tag, attrs in dom.tags:
        assert not any(name.startswith("on") or name.startswith("data-") for name in attrs), (tag, attrs)
        assert not any((value or "").lower().startswith("javascript:") for value in attrs.values()), (tag, attrs)
        if tag == "img":
            assert (attrs.get("src") or "").startswith("data:image/png;base64,")
    text = "".join(dom.text)
    assert "WIPED" not in text.replace("innerHTML='WIPED'", "")
    # The hostile output is there, as text a reader can see, with the DSML sentinel in the drill-down.
    for piece in HOSTILE.splitlines():
        assert piece in text, f"{piece!r} is not shown as text"
    assert "CORRUPT: 2 of 5 completed sessions" in text

    shot = tmp_path / "browser-test.png"
    # Tall enough to hold the whole page down to the open drill-down of the first corrupt session.
    browse(report.as_uri(), tmp_path / "p2", f"--screenshot={shot}", "--hide-scrollbars", height=2700)
    assert shot.stat().st_size > 10_000
    humans = Path(__file__).resolve().parents[1] / "reports" / "browser-test.png"
    humans.parent.mkdir(exist_ok=True)
    shutil.copyfile(shot, humans)


SCREEN_WIDTH = 1366
"""The narrowest common laptop screen: every report must fit it without scrolling sideways."""
CSP = re.compile(r'<meta http-equiv="Content-Security-Policy"[^>]*>')
MEASURE = """<script>
const width = window.innerWidth, wide = [];
const scrolls = (el) => { for (let p = el.parentElement; p; p = p.parentElement) {
  if (["auto", "scroll", "hidden"].includes(getComputedStyle(p).overflowX)) return true; } return false; };
for (const el of document.body.querySelectorAll("*")) {
  const box = el.getBoundingClientRect();
  if (box.right > width + 1 && !scrolls(el)) wide.push(el.tagName.toLowerCase() + "." + el.className + " " + Math.round(box.right));
}
document.title = JSON.stringify({scroll: document.documentElement.scrollWidth, width: width,
                                 height: document.documentElement.scrollHeight, wide: wide.slice(0, 10)});
</script></body>"""
MAX_SHOT_HEIGHT = 12_000


def layout(page: Path, profile: Path) -> dict:
    """The page's width against the viewport's at SCREEN_WIDTH, and the elements that stick out of it
    (not counting those inside a scrolling box), measured by a script in a copy without the page's policy."""
    measured = page.with_name(page.stem + "-measured.html")
    measured.write_text(CSP.sub("", page.read_text(encoding="utf-8")).replace("</body>", MEASURE), encoding="utf-8")
    title = Dom(browse(measured.as_uri(), profile, "--dump-dom", width=SCREEN_WIDTH, height=900)).title
    return json.loads(title)


def _matrix_spec(tmp_path: Path) -> Path:
    """The shipped simulator matrix at a test's size: one replicate of 8 sessions a cell under pressure. Edited as text:
    YAML 1.1 would read its levels `off:` and `on:` back as booleans."""
    root = Path(__file__).resolve().parents[1]
    text = (root / "matrices" / "sim_hicache_bf16.yaml").read_text(encoding="utf-8")
    for old, new in (("sessions: 32", "sessions: 8"),
                     ("concurrency: 32", "concurrency: 8"), ("replicates: 2", "replicates: 1"),
                     ("min_completed: 40", "min_completed: 8"),
                     # Few sessions hold too little to make HiCache evict and load back: each gets a long document.
                     ("stall_timeout: 30", "stall_timeout: 30\n  pressure: auto")):
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / "matrix.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_every_report_kind_fits_a_laptop_screen(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Run, matrix, sweep and bisect reports from real runs on the simulator (virtual clock: the same faults
    at any machine load), each screenshot at 1,366 px and checked for horizontal overflow."""
    virtual = "--clock virtual --final-after-turns 10"
    commands = {
        "run": (["run", "--sim-args", "--clock virtual", "--sessions", "40", "--turns", "4"], "report.html"),
        "sweep": (["sweep", "--sim-args", virtual, "--concurrency", "1,4", "--sessions", "4", "--turns", "14"],
                  "sweep.html"),
        "matrix": (["matrix", str(_matrix_spec(tmp_path)), "--var", "clock=virtual", "--no-cell-reports"],
                   "report.html"),
        "bisect": (["bisect", "flags", "--good", f"{virtual} --index-k-dtype bf16 /",
                    "--bad", f"{virtual} --enable-hierarchical-cache --index-k-dtype bf16 /",
                    "--sessions", "16", "--max-rounds", "1", "--turns", "14", "--good-rate", "0.02"], "report.html"),
    }
    # A reviewer who wants the screenshots names a directory; a test run leaves nothing outside tmp_path.
    screens = Path(os.environ["REPRO_SCREENS_DIR"]) if os.environ.get("REPRO_SCREENS_DIR") else None
    for kind, (argv, page) in commands.items():
        out = tmp_path / kind
        code, stdout, err = run_main(capsys, *argv, "--out", str(out))
        assert code in (0, 1), f"{kind}: exit {code}\n{stdout[-2000:]}{err[-2000:]}"
        html = out / page
        measured = layout(html, tmp_path / f"profile-{kind}")
        assert measured["scroll"] <= measured["width"] == SCREEN_WIDTH, (kind, measured)
        assert measured["wide"] == [], (kind, measured)
        shot = tmp_path / f"{kind}.png"
        browse(html.as_uri(), tmp_path / f"shot-{kind}", f"--screenshot={shot}", "--hide-scrollbars",
               width=SCREEN_WIDTH, height=min(measured["height"], MAX_SHOT_HEIGHT))
        assert shot.stat().st_size > 10_000, kind
        if screens is not None:
            screens.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(shot, screens / f"{kind}.png")
    # The run report shows a corrupt turn's raw text beside its parsed message (virtual clock: seed 0 corrupts).
    assert '<div class="side-by-side">' in (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
