"""The report page in a real browser (headless Chromium), for tests and `nox -s report_browser` only.

A screenshot shows what a reader's browser makes of report.html (the embedded images decoded, the
colours applied), which a string comparison of the HTML cannot; users never need it, so it lives here.
`nox -s tests` (CI) installs Debian's chromium with apt-get when it is absent and it runs as root
(`ensure_installed`); elsewhere the browser test is skipped in one line that says how to get it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.helpers.apt import Unavailable, apt_install

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
PACKAGE = "chromium"  # Debian's
# Headless, as root in a container (no sandbox), and nothing that reaches for the network on its own
# (QUIC, component updates, sync, first-run pages): on a closed network those would be refused or wait.
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars")


def find_browser() -> str | None:
    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


def why_not_installable() -> str | None:
    """None when Chromium can be installed here (root, apt-get), else the reason."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return f"installing {PACKAGE} needs root (apt-get install {PACKAGE})"
    if shutil.which("apt-get") is None:
        return f"no apt-get to install {PACKAGE} with"
    return None


def ensure_installed(log=print) -> float:
    """apt-get install chromium when no browser is found; the seconds it took (0 when one was there)."""
    if find_browser() is not None:
        return 0.0
    reason = why_not_installable()
    if reason:
        raise Unavailable(reason)
    took = apt_install([PACKAGE], log, why=f"no {' / '.join(BROWSERS)} on the PATH")
    if find_browser() is None:
        raise Unavailable(f"after apt-get install {PACKAGE}, still no {' / '.join(BROWSERS)} on the PATH")
    return took


def screenshot_html(page: Path, png: Path, width: int = 1280, height: int = 2400, timeout: float = 180) -> Path:
    """Render `page` in headless Chromium (a fresh profile each time) and save a screenshot."""
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError(f"no Chromium found (apt-get install {PACKAGE})")
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
                        f"--screenshot={png}", Path(page).resolve().as_uri()],
                       check=True, capture_output=True, timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot of {page}")
    return png
