"""The reports in a real browser (headless Chromium): the JS runs without errors and the page draws.

Screenshots (1400x900, the window's top: headline, then the timeline) land in pytest's tmp dir (kept for the
last few runs), and also in the folder ``TOPOCC_REPORT_SHOTS`` names, for a person to look at.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

import pytest

from topocc.planner.report import render_html, render_topology_html

from .conftest import SIZE, Plan

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed "
                                "(Debian: apt-get install chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]


def chromium(page: Path, *args: str) -> tuple[str, str]:
    """Run headless Chromium on a local page with a fresh profile; returns (stdout, stderr)."""
    assert CHROMIUM is not None  # the module skips without it
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, page.as_uri()],
                              capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
    return done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")


def png_summary(path: Path) -> tuple[int, int, int]:
    """(width, height, distinct byte values in the image data): a blank page has very few."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        if data[pos + 4:pos + 8] == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    return width, height, len(set(zlib.decompress(idat)))


def check_in_browser(html: str, out: Path, name: str, height: int = 900) -> tuple[Path, str]:
    """Open the page: no console errors, the JS finished, every SVG is in the DOM; then take a screenshot.

    Returns the screenshot and the DOM as the page's scripts left it.  Where
    ``TOPOCC_REPORT_SHOTS`` names a folder, the screenshot is copied there too,
    for a person to look at.
    """
    page = out / f"{name}.html"
    page.write_text(html)
    dom, log = chromium(page, "--dump-dom")
    errors = [line for line in log.splitlines() if "Uncaught" in line or ("CONSOLE" in line and "rror" in line)]
    assert not errors, errors
    svgs = html.count("<svg")
    assert re.search(rf'<body[^>]*data-ready="{svgs}"', dom), "the page's script did not finish"
    assert dom.count("<svg") == svgs
    shot = out / f"{name}.png"
    chromium(page, f"--screenshot={shot}", f"--window-size=1400,{height}")
    width, h, distinct = png_summary(shot)
    assert (width, h) == (1400, height)
    assert shot.stat().st_size > 30_000 and distinct > 50, "the screenshot looks blank"
    if os.environ.get("TOPOCC_REPORT_SHOTS"):
        keep = Path(os.environ["TOPOCC_REPORT_SHOTS"])
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, keep / shot.name)
    return shot, dom


def drawn_timeline(dom: str) -> dict[str, str]:
    """The data attributes the timeline's script sets once it has drawn: view, rows and bars drawn."""
    tag = re.search(r'<div[^>]*id="tl"[^>]*>', dom)
    assert tag, "no timeline"
    return dict(re.findall(r'data-(\w+)="([^"]*)"', tag.group(0)))


def test_dgx1_ring_report(dgx1_ring: Plan, tmp_path: Path) -> None:
    """8 ranks: a row per rank and channel (6 rings), every message end drawn, the 16 busiest links."""
    p = dgx1_ring
    html = render_html(p.topology, p.schedule, SIZE, baselines=p.baselines, run=p.run)
    _, dom = check_in_browser(html, tmp_path, "dgx1-v100-8-ranks")
    assert drawn_timeline(dom) == {"rows": str(8 * 6 + 16), "view": "lanes", "bars": str(2 * p.run.messages)}
    check_in_browser(render_topology_html(p.topology), tmp_path, "dgx1-topology")


def test_a100_32_rank_report(a100_shipped: Plan, tmp_path: Path) -> None:
    """32 ranks in 4 hosts: a row per rank and each of the 4 pipelined channels."""
    p = a100_shipped
    _, dom = check_in_browser(render_html(p.topology, p.schedule, SIZE, run=p.run), tmp_path, "dgx-a100-32-ranks")
    assert drawn_timeline(dom) == {"rows": str(32 * 4 + 16), "view": "lanes", "bars": str(2 * p.run.messages)}


@pytest.mark.slow
def test_fattree_1024_report(fattree_shipped: Plan, tmp_path: Path) -> None:
    """1024 ranks: a busy strip per rack (32), none per message."""
    p = fattree_shipped
    _, dom = check_in_browser(render_html(p.topology, p.schedule, SIZE, run=p.run), tmp_path, "fattree-1024-ranks")
    assert drawn_timeline(dom) == {"rows": str(32 + 16), "view": "rack", "bars": "0"}
