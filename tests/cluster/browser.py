"""A headless Chromium on the Argo UI, as the browser tests use it (tests/cluster/test_ui.py on
the KWOK cluster, tests/cluster/test_real_pods.py on the real node).

Debian's `chromium` (apt; scripts/system-deps.sh group ui) driven by Playwright's Python package
through its executable path: Playwright never downloads a browser. Screenshots of each stage go to
``$PIPECTL_TEST_LOGS/ui`` (default ``.pipectl/test-logs/ui``)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.harness.binaries import VERSIONS

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("PIPECTL_CHROMIUM", "/usr/bin/chromium")
SHOTS = Path(os.environ.get("PIPECTL_TEST_LOGS", REPO / ".pipectl" / "test-logs")) / "ui"


def require_or_skip(what: str) -> None:
    if os.environ.get("PIPECTL_REQUIRE_CLUSTER") == "1":
        pytest.fail(what)
    pytest.skip(what)


@contextlib.contextmanager
def launch_chromium():
    """Headless Chromium from Debian (never a downloaded one); skipped (failed under
    PIPECTL_REQUIRE_CLUSTER=1) when Playwright or Chromium is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require_or_skip("playwright is not installed (the dev extra in pyproject.toml)")
    if not os.access(CHROMIUM, os.X_OK):
        require_or_skip(f"{CHROMIUM} missing (Debian packages chromium, chromium-driver: scripts/system-deps.sh ui)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        # --no-sandbox: the tests run as root (CI), where Chromium's sandbox refuses to start
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


class UI:
    """One browser page on the Argo UI, with what a user does and sees."""

    def __init__(self, browser, base: str, test: str) -> None:
        self.ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        # a returning user: the first-visit modal ("Tell us what you want to use Argo for") and the
        # new-version one were dismissed before (the UI's localStorage keys, ui/src/modals/
        # modal-switch.tsx); either could open after dismiss_modals() and take a later click
        seen = VERSIONS["workflow-controller"].rsplit(".", 1)[0]  # the UI's majorMinor(): v4.0.5 -> v4.0
        self.ctx.add_init_script("localStorage.setItem('modal/ftu', JSON.stringify('dismissed'));"
                                 f"localStorage.setItem('modal/version', JSON.stringify('{seen}'));")
        self.page = self.ctx.new_page()
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.base = base
        self.test = test
        self.shots: list[Path] = []

    def open(self, path: str) -> None:
        self.page.goto(self.base + path, wait_until="networkidle")
        self.dismiss_modals()

    def dismiss_modals(self) -> None:
        """Close the first-visit modals ("Tell us what you want to use Argo for", ...), as a user
        does; one may open a moment after the page has loaded."""
        for _ in range(3):
            close = self.page.locator(".modal-close")
            if not close.count():
                break
            close.first.click()
            self.page.wait_for_timeout(300)

    def shot(self, stage: str) -> Path:
        path = SHOTS / f"{self.test}-{len(self.shots) + 1:02d}-{stage}.png"
        self.page.screenshot(path=str(path))
        self.shots.append(path)
        return path

    def graph(self) -> dict[str, str]:
        """{node label: phase} of the workflow graph as drawn (each node: <title>ID (label)</title>
        beside <g class="node PHASE">)."""
        return self.page.locator("g:has(> title) > g.node").evaluate_all("""els => Object.fromEntries(els.map(e => [
            e.parentElement.querySelector(':scope > title').textContent.replace(/^.*? \\((.*)\\)$/, '$1'),
            (e.getAttribute('class') || '').split(' ').filter(c => c && c !== 'node').join(' ')]))""")

    def click_node(self, label: str) -> None:
        """Click a node of the graph (its circle: the label under it takes no clicks), as a user
        selects a step; the step's panel opens."""
        self.dismiss_modals()
        self.page.locator(f"xpath=//*[local-name()='g'][*[local-name()='title' and contains(., '({label})')]]"
                          "/*[local-name()='g' and contains(@class, 'node')]").first.click()
        self.page.locator(".workflow-details__step-info").wait_for()

    def node_phase(self, workflow: str) -> str:
        """The phase the graph shows for the workflow's own node."""
        return self.graph().get(workflow, "")

    def wait_node_phase(self, workflow: str, phases: set[str], timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        phase = ""
        while time.monotonic() < deadline:
            phase = self.node_phase(workflow)
            if phase in phases:
                return phase
            self.page.wait_for_timeout(1000)
        raise AssertionError(f"the UI did not show {workflow} in {phases} within {timeout_s}s (last: {phase!r})")

    def close(self) -> None:
        self.ctx.close()
