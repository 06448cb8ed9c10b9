"""A real browser opens a report built from hostile model output: nothing may run, everything must read as text.

Headless Chromium (Debian's `chromium`, installed by `.ci/run`) loads the page from disk; `--dump-dom`
returns the DOM after load, so a payload that ran would show as a changed title, an added element or
attribute. A control page with a real script proves the browser runs JavaScript at all, so "no script
ran" is not vacuous. The DOM check runs on the report with its Content-Security-Policy removed, so
autoescaping alone must hold; the screenshot is of the report as shipped.
"""

from __future__ import annotations

import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from repro.procs.process import ManagedProcess
from repro.report import render_report
from run_builders import SENTINEL, make_run

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
TIMEOUT_S = 60.0


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


def browse(url: str, profile: Path, *mode: str, height: int = 1400) -> str:
    """Run headless Chromium once on `url` in its own process group; its stdout (the DOM for --dump-dom)."""
    argv = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        "--disable-extensions", f"--user-data-dir={profile}", f"--window-size=1280,{height}", *mode, url,
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
