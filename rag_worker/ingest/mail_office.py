"""E-mail (.eml, .msg), legacy and open office files (.doc, .xls, .ppt, .odt, .ods, .odp, .rtf) and .epub.

- Office files go through one converter, LibreOffice headless (Debian's `libreoffice-*-nogui`, installed by
  scripts/setup.sh): it turns each into the Office Open XML twin (.docx, .xlsx, .pptx) that Docling already reads
  with headings, lists and tables intact. No maintained Python library reads the binary .doc and .ppt formats
  (antiword/catdoc give plain text without tables and have not changed in two decades), and one converter keeps
  every format on the same tested path. It runs as a child process with its own profile folder, a time limit
  (OFFICE_TIMEOUT_S) and an address-space limit (OFFICE_MEMORY_MB). It must never fetch what a file links to
  (an ODT's linked image would otherwise make the worker request any URL: SSRF): the profile sets
  `BlockUntrustedRefererLinks`, and the process runs in a network namespace of its own (`unshare -n`, no
  network at all) where the host allows one.
- .epub is a zip of XHTML chapters: read in spine order and given to Docling as one HTML document.
- .eml is read with the standard library's `email` package, .msg with `extract-msg`. The headers become the
  document's first lines and its metadata; the plain body is indexed (the HTML body, as text, when there is no
  plain one); attachments of a supported type are returned so that ingestion indexes each as its own document.
"""

from __future__ import annotations

import contextlib
import email
import email.policy
import logging
import os
import posixpath
import re
import shutil
import signal
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from xml.etree import ElementTree

from docling_core.types.doc import DocItemLabel, DoclingDocument

from .formats import IngestError

log = logging.getLogger(__name__)

# kind -> the Office Open XML kind LibreOffice converts it to.
OFFICE_TWIN = {
    "doc": "docx",
    "rtf": "docx",
    "odt": "docx",
    "xls": "xlsx",
    "ods": "xlsx",
    "ppt": "pptx",
    "odp": "pptx",
}
MAIL_KINDS = {"eml", "msg"}


def soffice() -> str | None:
    return shutil.which("soffice") or shutil.which("libreoffice")


def office_available() -> bool:
    return soffice() is not None


def _original(module: str, name: str):
    """The unpatched function under gevent: this runs in a native thread, where gevent's child watchers and
    sleeps do not work (they belong to the main thread's loop)."""
    try:
        from gevent import monkey

        return monkey.get_original(module, name)
    except ImportError:
        import importlib

        return getattr(importlib.import_module(module), name)


# The per-job profile's settings (registrymodifications.xcu): linked images, OLE links and the like are not
# fetched from anywhere while a document is loaded.
PROFILE_SETTINGS = """<?xml version="1.0" encoding="UTF-8"?>
<oor:items xmlns:oor="http://openoffice.org/2001/registry" xmlns:xs="http://www.w3.org/2001/XMLSchema"
 xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">
<item oor:path="/org.openoffice.Office.Common/Security/Scripting"><prop oor:name="BlockUntrustedRefererLinks"
 oor:op="fuse"><value>true</value></prop></item>
</oor:items>
"""

_NO_NETWORK: list[list[str]] = []  # the command prefix that cuts a child off the network, once probed


def write_profile(profile: Path) -> None:
    """A fresh LibreOffice profile folder whose settings block every linked (not embedded) resource."""
    user = profile / "user"
    user.mkdir(parents=True, exist_ok=True)
    (user / "registrymodifications.xcu").write_text(PROFILE_SETTINGS, encoding="utf-8")


def no_network_prefix() -> list[str]:
    """`unshare -n` (or, unprivileged, `unshare -rn`) when this host lets a process leave the network; [] with
    a logged warning when it does not (the profile's BlockUntrustedRefererLinks is then the only layer).
    Probed once per process (the sandbox helper probes while it warms up, so its jobs' forks inherit it)."""
    if _NO_NETWORK:
        return _NO_NETWORK[0]
    prefix: list[str] = []
    unshare = shutil.which("unshare")
    for candidate in ([unshare, "-n"], [unshare, "-rn"]) if unshare else ():
        try:
            code = run_limited(
                [*candidate, "true"],
                timeout_s=10,
                memory_mb=512,
                env=dict(os.environ),
                log_path=Path(os.devnull),
            )
        except (TimeoutError, OSError):
            continue
        if code == 0:
            prefix = candidate
            break
    if not prefix:
        log.warning(
            "LibreOffice conversions run with network access: `unshare -n` is not available here (install "
            "util-linux and allow user namespaces); linked resources are still blocked by the profile"
        )
    _NO_NETWORK.append(prefix)
    return prefix


def run_limited(cmd: list[str], *, timeout_s: float, memory_mb: int, env: dict, log_path: Path) -> int:
    """Run a command in its own session under an address-space limit (prlimit) and a time limit.

    Spawned with posix_spawn and polled with the original waitpid, so it works from gevent's thread pool.
    Returns the exit code; raises TimeoutError after killing the whole process group.
    """
    waitpid = _original("os", "waitpid")
    sleep = _original("time", "sleep")
    spawn = _original("os", "posix_spawn")
    prlimit = shutil.which("prlimit")
    if prlimit:
        cmd = [prlimit, f"--as={memory_mb * 1024 * 1024}", "--", *cmd]
    with open(log_path, "wb") as out, open(os.devnull, "rb") as devnull:
        pid = spawn(
            cmd[0],
            cmd,
            env,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull.fileno(), 0),
                (os.POSIX_SPAWN_DUP2, out.fileno(), 1),
                (os.POSIX_SPAWN_DUP2, out.fileno(), 2),
            ],
            setsid=True,
        )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, status = waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped elsewhere: the caller checks the output file
            return 0
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                waitpid(pid, 0)
            raise TimeoutError
        sleep(0.05)


def office_to_ooxml(path: Path, kind: str, out_dir: Path, *, timeout_s: float, memory_mb: int) -> Path:
    """Convert with LibreOffice headless into out_dir; the converted file, or IngestError saying why not."""
    binary = soffice()
    if binary is None:
        raise IngestError(
            "converter_missing",
            f".{kind} files need LibreOffice: install the Debian packages libreoffice-writer-nogui, "
            "libreoffice-calc-nogui and libreoffice-impress-nogui (scripts/setup.sh --dev does)",
        )
    target = OFFICE_TWIN[kind]
    source = out_dir / f"source.{kind}"
    shutil.copyfile(path, source)
    profile = out_dir / "profile"
    write_profile(profile)
    cmd = [
        *no_network_prefix(),
        binary,
        f"-env:UserInstallation={profile.as_uri()}",
        "--headless",
        "--norestore",
        "--nolockcheck",
        "--nodefault",
        "--convert-to",
        target,
        "--outdir",
        str(out_dir),
        str(source),
    ]
    log_path = out_dir / "soffice.log"
    env = {**os.environ, "HOME": str(out_dir), "SAL_USE_VCLPLUGIN": "svp"}
    try:
        code = run_limited(cmd, timeout_s=timeout_s, memory_mb=memory_mb, env=env, log_path=log_path)
    except TimeoutError as exc:
        raise IngestError(
            "timeout", f"converting the .{kind} file took longer than {timeout_s:g} s (OFFICE_TIMEOUT_S)"
        ) from exc
    converted = out_dir / f"source.{target}"
    if not converted.exists() or converted.stat().st_size == 0:
        output = log_path.read_text("utf-8", "replace").strip().splitlines() if log_path.exists() else []
        detail = output[-1] if output else f"exit {code}"
        raise IngestError("corrupt", f"the file is damaged or not a valid {kind} file ({detail[:200]})")
    return converted


# -- epub --------------------------------------------------------------------------------------------------------

_NS = {
    "c": "urn:oasis:names:tc:opendocument:xmlns:container",
    "opf": "http://www.idpf.org/2007/opf",
    "dc": "http://purl.org/dc/elements/1.1/",
}


def epub_to_html(path: Path) -> tuple[str, str]:
    """(title, one HTML document of the chapters in reading order)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
            container = ElementTree.fromstring(zf.read("META-INF/container.xml"))
            rootfile = container.find(".//c:rootfile", _NS)
            opf_path = rootfile.get("full-path") if rootfile is not None else None
            if not opf_path or opf_path not in names:
                raise IngestError("corrupt", "the EPUB has no package document (content.opf)")
            opf = ElementTree.fromstring(zf.read(opf_path))
            base = posixpath.dirname(opf_path)
            title_el = opf.find(".//dc:title", _NS)
            title = (title_el.text or "").strip() if title_el is not None else ""
            manifest = {
                item.get("id"): item.get("href")
                for item in opf.findall(".//opf:manifest/opf:item", _NS)
                if item.get("id") and item.get("href")
            }
            bodies = []
            for ref in opf.findall(".//opf:spine/opf:itemref", _NS):
                href = manifest.get(ref.get("idref"))
                if not href:
                    continue
                member = posixpath.normpath(posixpath.join(base, href.split("#")[0]))
                if member in names:
                    bodies.append(_html_body(zf.read(member).decode("utf-8", "replace")))
    except IngestError:
        raise
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError, OSError) as exc:
        raise IngestError("corrupt", f"the EPUB is damaged and cannot be read ({exc})") from exc
    if not bodies:
        raise IngestError("empty", "the EPUB has no chapters")
    heading = f"<h1>{_escape(title)}</h1>" if title else ""
    return title, f"<html><body>{heading}{''.join(bodies)}</body></html>"


_BODY = re.compile(r"<body[^>]*>(.*)</body>", re.DOTALL | re.IGNORECASE)


def _html_body(xhtml: str) -> str:
    m = _BODY.search(xhtml)
    return m.group(1) if m else xhtml


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# -- e-mail ------------------------------------------------------------------------------------------------------


@dataclass
class Mail:
    subject: str
    headers: dict[str, str]
    body: str
    attachments: list[tuple[str, bytes]] = field(default_factory=list)


def html_to_text(html: str) -> str:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for tag in soup(["script", "style", "head"]):
        tag.decompose()
    for br in soup.find_all(["br"]):
        br.replace_with("\n")
    for block in soup.find_all(["p", "div", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"]):
        block.insert_after("\n\n")
    return re.sub(r"\n{3,}", "\n\n", soup.get_text()).strip()


def read_eml(path: Path) -> Mail:
    try:
        msg = email.message_from_bytes(path.read_bytes(), policy=email.policy.default)
    except Exception as exc:
        raise IngestError("corrupt", f"the e-mail cannot be read ({exc})") from exc
    headers = {}
    for name in ("From", "To", "Cc", "Date", "Subject"):
        value = msg.get(name)
        if value:
            headers[name.lower()] = " ".join(str(value).split())
    plain, html = [], []
    attachments: list[tuple[str, bytes]] = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        filename = part.get_filename()
        disposition = part.get_content_disposition()
        if filename or disposition == "attachment":
            data = part.get_payload(decode=True) or b""
            if data:
                attachments.append((filename or "attachment", data))
            continue
        ctype = part.get_content_type()
        try:
            content = part.get_content()
        except (LookupError, ValueError):
            content = (part.get_payload(decode=True) or b"").decode("utf-8", "replace")
        if ctype == "text/plain":
            plain.append(str(content))
        elif ctype == "text/html":
            html.append(html_to_text(str(content)))
    body = "\n\n".join(plain) if any(p.strip() for p in plain) else "\n\n".join(html)
    return Mail(headers.get("subject", ""), headers, body, attachments)


def read_msg(path: Path) -> Mail:
    import extract_msg

    try:
        msg = extract_msg.openMsg(str(path), strict=False)
    except Exception as exc:
        raise IngestError("corrupt", f"the Outlook message cannot be read ({exc})") from exc
    try:
        headers = {}
        for key, value in (
            ("from", msg.sender),
            ("to", msg.to),
            ("cc", msg.cc),
            ("date", msg.date),
            ("subject", msg.subject),
        ):
            if value:
                headers[key] = " ".join(str(value).split())
        body = msg.body or ""
        if not body.strip() and msg.htmlBody:
            raw = msg.htmlBody
            body = html_to_text(raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw)
        attachments = []
        for att in msg.attachments:
            data = getattr(att, "data", None)
            name = getattr(att, "longFilename", None) or getattr(att, "shortFilename", None) or "attachment"
            if isinstance(data, bytes) and data:
                attachments.append((name, data))
    finally:
        msg.close()
    return Mail(headers.get("subject", ""), headers, body, attachments)


_PARAGRAPH_BREAK = re.compile(r"\n\s*\n")


def mail_document(mail: Mail, name: str) -> DoclingDocument:
    doc = DoclingDocument(name=name or "message")
    if mail.subject:
        doc.add_text(label=DocItemLabel.TITLE, text=mail.subject)
    lines = [f"{k.capitalize()}: {v}" for k, v in mail.headers.items() if k != "subject"]
    if mail.attachments:
        lines.append("Attachments: " + ", ".join(n for n, _ in mail.attachments))
    if lines:
        doc.add_text(label=DocItemLabel.TEXT, text="\n".join(lines))
    for para in _PARAGRAPH_BREAK.split(mail.body.replace("\r\n", "\n")):
        if para.strip():
            doc.add_text(label=DocItemLabel.TEXT, text=para.strip())
    return doc


def temp_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="rag-convert-")
