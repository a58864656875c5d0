"""Browser fixtures: Debian's chromium (/usr/bin/chromium, `make test` installs it) driven by Playwright
against the live daphne servers of tests/live_servers.py; an operator (a staff user) of the auth server
and a page logged in as them. Nothing downloads a browser: Playwright is pointed at the system binary."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.live_servers import manage

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
OPERATOR = ("operator", "console-operator-password-1")


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (the system's), closed after the module's tests."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_FLAGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, tmp_path):
    """A fresh browser context's page (light colour scheme, 1280x900); a screenshot of how it was
    left goes to the test's tmp_path as `last.png`."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    context.set_default_timeout(30_000)
    pg = context.new_page()
    yield pg
    try:
        pg.screenshot(path=str(tmp_path / "last.png"), full_page=True)
    finally:
        context.close()


@pytest.fixture(scope="session")
def operator(auth_server):
    """(username, password) of a staff superuser in the auth server's database (manage.py createsuperuser)."""
    username, password = OPERATOR
    manage(auth_server, "createsuperuser", "--noinput", "--username", username, "--email", "operator@example.com",
           env={"DJANGO_SUPERUSER_PASSWORD": password})
    return OPERATOR


def log_in(page, server, credentials) -> None:
    """Log `page` into `server`'s admin through its login form as `credentials` (username, password)."""
    page.goto(server.url + "/admin/login/?next=/admin/")
    page.fill("#id_username", credentials[0])
    page.fill("#id_password", credentials[1])
    page.click("input[type=submit]")
    page.wait_for_url(server.url + "/admin/")


@pytest.fixture
def operator_page(page, auth_server, operator):
    """`page` logged into the auth server's admin as the operator."""
    log_in(page, auth_server, operator)
    return page
