"""Without web/node_modules the chat would be a blank page: the gateway says what to run instead."""

from __future__ import annotations

import json
import shutil

from starlette.testclient import TestClient

from gateway.app import create_app
from tests.servers import ROOT
from tests.unit.test_gateway_api import make_settings


def test_missing_web_libraries_get_a_page_with_the_command_then_the_chat_once_installed(tmp_path):
    web = tmp_path / "web"
    shutil.copytree(ROOT / "web", web, ignore=shutil.ignore_patterns("node_modules"), symlinks=False)
    with TestClient(create_app(make_settings(tmp_path, WEB_DIR=web))) as client:
        page = client.get("/")
        assert page.status_code == 503 and "npm ci --prefix web" in page.text
        assert "node_modules/marked" in page.text and "node_modules/dompurify" in page.text
        assert client.get("/health").status_code in (200, 503), "the API still answers"
        assert client.get("/api/auth/me").status_code == 401

        for package in ("marked", "dompurify", "pdfjs-dist"):  # what `npm ci --prefix web` leaves behind
            (web / "node_modules" / package).mkdir(parents=True)
            (web / "node_modules" / package / "package.json").write_text(json.dumps({"name": package}))
        page = client.get("/")
        assert page.status_code == 200 and "<script" in page.text and "not installed" not in page.text
