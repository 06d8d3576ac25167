"""The report in a real browser: headless Chromium (Debian package ``chromium``) loads it with no
console errors, exceptions or outside requests, and every plot decodes (naturalWidth > 0)."""

import pytest

from reports.browser import check_page, find_chromium, screenshot

pytestmark = pytest.mark.skipif(find_chromium() is None,
                                reason="chromium not installed (apt-get install -y chromium)")


def test_report_loads_clean(small_report):
    v = check_page(small_report["html"])
    assert v["console_errors"] == [] and v["exceptions"] == [] and v["external_requests"] == []
    assert len(v["images"]) == 4
    assert all(i["naturalWidth"] > 0 and i["naturalHeight"] > 0 for i in v["images"])
    assert v["ok"]


def test_check_catches_errors_and_broken_images(tmp_path):
    page = tmp_path / "bad.html"
    page.write_text("<html><body><img alt='x' src='data:image/png;base64,AAAA'>"
                    "<script>console.error('boom')</script></body></html>")
    v = check_page(page)
    assert not v["ok"]
    assert v["console_errors"] == ["boom"]
    assert v["images"] == [{"alt": "x", "naturalWidth": 0, "naturalHeight": 0}]


def test_screenshot_is_a_png(small_report, tmp_path):
    png = screenshot(small_report["html"], tmp_path / "s.png", size=(800, 600))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
