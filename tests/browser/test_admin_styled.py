"""The admin in a real browser: its stylesheets and scripts are served (WhiteNoise), and it looks like Django's."""
from __future__ import annotations


def test_it_serves_the_admin_stylesheet(page, auth_server):
    responses = []
    page.on("response", lambda r: responses.append(r))
    page.goto(auth_server.url + "/admin/login/")
    css = [r for r in responses if r.url.endswith("/static/admin/css/base.css")]
    assert len(css) == 1 and css[0].status == 200
    assert css[0].headers["content-type"].startswith("text/css")
    assert "DJANGO Admin styles" in css[0].text()
    # Applied, not only fetched: the header bar has the admin's --header-bg (#417690).
    assert page.eval_on_selector("#header", "e => getComputedStyle(e).backgroundColor") == "rgb(65, 118, 144)"


def test_it_renders_the_admin_index_styled(operator_page, auth_server, tmp_path):
    page = operator_page
    failed = []
    page.on("response", lambda r: failed.append(r.url) if "/static/" in r.url and r.status >= 400 else None)
    page.goto(auth_server.url + "/admin/")
    assert page.inner_text("#site-name") == "Django administration"
    # The app list is a styled table module, the header's user tools sit on its right.
    assert page.eval_on_selector(".module caption", "e => getComputedStyle(e).backgroundColor") == "rgb(65, 118, 144)"
    assert page.eval_on_selector("#user-tools", "e => getComputedStyle(e).textAlign") == "right"
    sheets = page.evaluate("[...document.styleSheets].map(s => s.href).filter(Boolean)")
    assert any(h.endswith("/static/admin/css/base.css") for h in sheets)
    page.screenshot(path=str(tmp_path / "admin_index.png"), full_page=True)
    assert failed == []
