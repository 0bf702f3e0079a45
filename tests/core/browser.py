"""The report page in a real browser (headless Chromium), for tests and `nox -s report_browser` only.

A screenshot shows what a reader's browser makes of report.html (the embedded images decoded, the
colours applied), which a string comparison of the HTML cannot; users never need it, so it lives here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


def screenshot_html(page: Path, png: Path, width: int = 1280, height: int = 2400, timeout: float = 180) -> Path:
    """Render `page` in headless Chromium and save a screenshot.

    --no-sandbox because CI containers run as root, where Chromium's sandbox refuses to start."""
    browser = find_browser()
    if browser is None:
        raise FileNotFoundError("no Chromium found (apt-get install chromium)")
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={png}", Path(page).resolve().as_uri()],
                   check=True, capture_output=True, timeout=timeout)
    if not png.is_file():
        raise RuntimeError(f"{browser} wrote no screenshot of {page}")
    return png
