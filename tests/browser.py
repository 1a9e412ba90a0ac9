"""Open an HTML file in real headless Chromium (the system's package): the DOM after scripts
ran, a screenshot, and every network request the page made (from Chromium's own net log).

Chromium runs with ``--host-resolver-rules="MAP * ~NOTFOUND"`` (no name resolves, so nothing
leaves the machine even if the page tried) and a fresh profile per call; the net log still
records each request the page *started*, which is what :func:`page_requests` returns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-default-apps", "--mute-audio",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--virtual-time-budget=15000"]
TIMEOUT_S = 180


def chromium() -> str | None:
    """The Chromium executable ($OPPROF_CHROMIUM, else one on PATH or /usr/bin), or None."""
    env = os.environ.get("OPPROF_CHROMIUM")
    if env:
        return env
    for name in CANDIDATES:
        found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists()
                                       else None)
        if found:
            return found
    return None


def _run(html: Path, *extra: str, width: int = 1400, height: int = 2400) -> str:
    exe = chromium()
    assert exe, "no chromium"
    with tempfile.TemporaryDirectory(prefix="opprof-chromium-") as profile:
        cmd = [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
               *extra, html.resolve().as_uri()]
        # start_new_session: on a timeout the whole process group (renderer, GPU and
        # utility processes) is killed, not only the browser process.
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.communicate()
            raise
        finally:
            try:  # children that outlive the browser process
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        return out


def dump_dom(html: Path, net_log: Path | None = None) -> str:
    """The page's DOM after its scripts ran (serialized)."""
    extra = [f"--log-net-log={net_log}", "--net-log-capture-mode=Default"] if net_log else []
    return _run(html, "--dump-dom", *extra)


def screenshot(html: Path, png: Path, width: int = 1400, height: int = 2400) -> Path:
    """A PNG of the page's first ``height`` pixels."""
    _run(html, f"--screenshot={png}", width=width, height=height)
    assert png.exists(), f"chromium wrote no screenshot of {html}"
    return png


def page_requests(net_log: Path) -> list[str]:
    """The URLs (other than file:, data:, blob:) of requests started by a page opened from a
    file: those whose network isolation key is the file:// site. Chromium's own background
    requests have other keys and are left out."""
    doc = json.loads(net_log.read_text())
    types = doc["constants"]["logEventTypes"]
    start = types["URL_REQUEST_START_JOB"]
    urls = []
    for e in doc["events"]:
        p = e.get("params") or {}
        if e["type"] == start and "file://" in str(p.get("network_isolation_key", "")):
            url = str(p.get("url", ""))
            if not url.startswith(("file:", "data:", "blob:")):
                urls.append(url)
    return urls


def distinct_colours(png: Path) -> int:
    """How many distinct RGB colours a PNG has (a blank page has one or two)."""
    from matplotlib import image

    img = image.imread(png)
    rgb = (img[..., :3] * 255).round().astype("uint8").reshape(-1, 3)
    import numpy as np

    return len(np.unique(rgb, axis=0))
