"""The admin API's dashboard in headless Chromium: the page fills itself from the live proxy
(policy, capacity, the queue, the η heat map, recent response times) and the screenshot shows
the heat map's colours and the latency plot's points."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest
from PIL import Image

from admission import ClassProfile, EtaModel, Limits, classify_sql
from testing.proxyharness import ProxyHarness

MakeProxy = Callable[..., ProxyHarness]
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "Chromium is required for this test (scripts/check installs it with apt)"
    return found


def _browse(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [
                _chromium(),
                *FLAGS,
                f"--user-data-dir={profile}",
                "--virtual-time-budget=4000",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )


def _model() -> EtaModel:
    def profile(sql: str, name: str, d: float, q: float) -> ClassProfile:
        c = classify_sql(sql)
        return ClassProfile(fingerprint=c.fingerprint, name=name, D=d, f=1, U=q / 4, Q=q, A=q)

    classes = (
        profile("select pg_sleep(0.01)", "sleep", 0.01, 0.5),
        profile("select count(*) from pg_class", "count", 0.002, 2.0),
    )
    # U_sleep/U_count = 1/4 and A^count_sleep / A^sleep_count = 4: P_{r,c} = ∓3.75, so the
    # max-p heat map has one strongly negative (red) and one strongly positive (blue) cell
    return EtaModel(classes=classes, A_matrix=((0.6, 2.0), (0.5, 2.4)), cores=2).with_eta()


@pytest.fixture
def proxy(make_proxy: MakeProxy) -> ProxyHarness:
    harness = make_proxy(
        admin=True, policy="max-p", model=_model(), limits=Limits(mpl=3, memory=2**30)
    )
    with psycopg.connect(
        host="127.0.0.1", port=harness.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        for _ in range(5):
            conn.execute("select pg_sleep(0.01)")
            conn.execute("select count(*) from pg_class").fetchall()
    return harness


def test_dashboard_renders_live_state(proxy: ProxyHarness) -> None:
    page = httpx.get(f"{proxy.admin_url}/dashboard")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    recent = httpx.get(f"{proxy.admin_url}/recent").json()
    assert len(recent) >= 10 and {"time", "class", "wait", "response"} <= set(recent[0])
    out = _browse(f"{proxy.admin_url}/dashboard", "--dump-dom")
    dom = out.stdout
    assert 'data-ready="yes"' in dom, out.stderr[-2000:]
    assert '<b id="policy">max-p</b>' in dom
    assert 'id="mpl">of 3<' in dom
    assert 'id="cap-memory-n">0 MiB/1024 MiB<' in dom  # the memory budget, none in use
    assert dom.count('<td style="background:rgb(') == 4  # the 2×2 η heat map
    assert "sleep" in dom and "count" in dom  # the legend of the latency plot


def test_dashboard_screenshot_shows_heat_map_and_points(
    proxy: ProxyHarness, tmp_path: Path
) -> None:
    shot = tmp_path / "dashboard.png"
    out = _browse(f"{proxy.admin_url}/dashboard", f"--screenshot={shot}", "--window-size=1280,900")
    assert shot.exists(), out.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 900)
    colors = image.getcolors(maxcolors=1 << 20) or []
    assert len(colors) > 200  # text, bars, a heat map and a plot, not a blank page
    pixels = {rgb for _, rgb in colors}
    # the latency plot's points in the first two palette colours (blue and orange)
    assert (0x2F, 0x6D, 0xB5) in pixels and (0xD9, 0x62, 0x2B) in pixels
    # the heat map: some strongly blue (positive) and some red (negative) cells
    assert any(b > 200 and r < 120 for r, g, b in pixels)
    assert any(r > 200 and g < 120 and b < 100 for r, g, b in pixels)
    image.save(tmp_path / "checked.png")


def test_dashboard_with_a_token(make_proxy: MakeProxy) -> None:
    harness = make_proxy(admin=True, admin_token="s3cret")
    assert httpx.get(f"{harness.admin_url}/status").status_code == 401
    dom = _browse(f"{harness.admin_url}/dashboard#token=s3cret", "--dump-dom").stdout
    assert 'data-ready="yes"' in dom and "HTTP 401" not in dom
    dom = _browse(f"{harness.admin_url}/dashboard", "--dump-dom").stdout
    assert "HTTP 401" in dom  # without the token the page says why it is empty
