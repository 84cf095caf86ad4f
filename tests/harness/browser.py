"""A real browser for the web door's tests: Debian's Chromium, headless,
driven by chromedriver through Selenium.

Each :class:`Browser` has its own profile directory (no cookies shared
between two browsers: two users, or an attacker's browser) and accepts
the gateway's self-signed certificate.  Screenshots come back as
:class:`tests.harness.x11.Screenshot`, so the pixel helpers of
:mod:`tests.harness.pixels` apply to them.
"""

from __future__ import annotations

import importlib.util
import io
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tests.harness.x11 import Screenshot

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
T = TypeVar("T")


def available() -> str | None:
    """Why the browser tests cannot run here, or None."""
    for path in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(path):
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (pip install selenium)"
    return None


def decode_png(data: bytes) -> Screenshot:
    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGBA")
    return Screenshot(image.width, image.height, image.tobytes())


class Browser:
    """Headless Chromium at ``width`` x ``height`` CSS pixels (device scale 1)."""

    def __init__(self, width: int = 1280, height: int = 900) -> None:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.profile = tempfile.mkdtemp(prefix="nxgate-chromium-")
        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
                         "--force-device-scale-factor=1", "--ignore-certificate-errors", "--no-first-run",
                         "--disable-extensions", "--disable-background-networking", "--password-store=basic"):
            options.add_argument(argument)
        options.accept_insecure_certs = True
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        service = Service(executable_path=CHROMEDRIVER, log_output=os.path.join(self.profile, "chromedriver.log"))
        self.driver: Any = webdriver.Chrome(options=options, service=service)
        self.driver.set_page_load_timeout(30)

    # ----------------------------------------------------------- navigation
    def get(self, url: str) -> None:
        self.driver.get(url)

    @property
    def url(self) -> str:
        return self.driver.current_url

    @property
    def source(self) -> str:
        return self.driver.page_source

    def find(self, css: str) -> Any:
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[Any]:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self) -> str:
        return self.find("body").text

    def wait(self, condition: Callable[[], T], timeout: float = 20.0, what: str = "the page") -> T:
        """Poll ``condition`` until it returns something true (exceptions count as not yet)."""
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            try:
                result = condition()
                if result:
                    return result
            except Exception as error:  # a page that is still loading
                last = error
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what} (last error: {last!r}); at {self.url}")

    def login(self, base: str, user: str, password: str) -> None:
        """Fill in and send the login form of the portal at ``base``."""
        self.get(base + "/login")
        self.find("input[name=user]").send_keys(user)
        self.find("input[name=password]").send_keys(password)
        self.find("form[action='/login'] button[type=submit]").click()

    def cookies(self) -> list[dict[str, Any]]:
        return self.driver.get_cookies()

    def console_errors(self) -> list[str]:
        """The browser console's errors since the last call (CSP violations show up here)."""
        return [entry["message"] for entry in self.driver.get_log("browser") if entry["level"] == "SEVERE"]

    # ----------------------------------------------------------- pictures
    def screenshot(self) -> Screenshot:
        return decode_png(self.driver.get_screenshot_as_png())

    def save_screenshot(self, path: str) -> str:
        self.driver.save_screenshot(path)
        return path

    def element_box(self, element: Any) -> tuple[int, int, int, int]:
        """(x, y, width, height) of an element in viewport pixels (for cropping screenshots)."""
        box = self.driver.execute_script(
            "var r = arguments[0].getBoundingClientRect(); return [r.left, r.top, r.width, r.height];", element)
        return tuple(round(value) for value in box)  # type: ignore[return-value]

    def quit(self) -> None:
        try:
            self.driver.quit()
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
