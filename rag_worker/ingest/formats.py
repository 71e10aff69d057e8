"""Which files ingestion accepts, and the per-file error that refuses one.

A file's type is decided by its extension AND by a cheap look at its bytes: a `.pdf` that is really a PNG, or
a `.docx` that is not an Office zip, is refused before a converter spends time on it.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from ..errors import ApiError

# extension -> kind. The kind picks the converter and the content sniff.
EXTENSIONS: dict[str, str] = {
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".csv": "csv",
    ".html": "html",
    ".htm": "html",
    ".md": "md",
    ".markdown": "md",
    ".txt": "txt",
    # Mail, legacy and open office formats, e-books (rag_worker/ingest/mail_office.py).
    ".tsv": "tsv",
    ".eml": "eml",
    ".msg": "msg",
    ".doc": "doc",
    ".xls": "xls",
    ".ppt": "ppt",
    ".odt": "odt",
    ".ods": "ods",
    ".odp": "odp",
    ".rtf": "rtf",
    ".epub": "epub",
    # Images, read by OCR (rag_worker/ingest/ocr.py).
    ".png": "png",
    ".jpg": "jpg",
    ".jpeg": "jpg",
    ".tif": "tiff",
    ".tiff": "tiff",
    ".webp": "webp",
}
_IMAGE_MAGIC = {
    "png": (b"\x89PNG\r\n\x1a\n",),
    "jpg": (b"\xff\xd8\xff",),
    "tiff": (b"II*\x00", b"MM\x00*"),
}

# Zip packages that are not Office Open XML, and the part (or mimetype) each one carries.
_ZIP_MIMETYPE = {
    "odt": b"application/vnd.oasis.opendocument.text",
    "ods": b"application/vnd.oasis.opendocument.spreadsheet",
    "odp": b"application/vnd.oasis.opendocument.presentation",
    "epub": b"application/epub+zip",
}
# OLE2 compound files: .doc, .xls, .ppt and Outlook .msg.
_OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
_OLE_KINDS = {"doc", "xls", "ppt", "msg"}

# The part every Office Open XML package of that kind carries.
_OOXML_PART = {"docx": "word/", "pptx": "ppt/", "xlsx": "xl/"}

# HTTP status per refusal code: bad input is 400, size bounds 413, unknown types 415, a conversion stopped by
# its memory or time limit (or crashing) 422.
_STATUS = {
    "unsupported_type": 415,
    "too_large": 413,
    "zip_bomb": 413,
    "too_many_cells": 413,
    "too_many_pages": 413,
    "too_many_chunks": 413,
    "image_too_large": 413,
    "convert_memory": 422,
    "convert_timeout": 422,
    "convert_failed": 422,
    "converter_unavailable": 503,
}


class IngestError(ApiError):
    """One file could not be ingested: a machine `code` and a `reason` a person can act on.

    It fails that file only; a batch reports it and goes on with the next file.
    """

    def __init__(self, code: str, reason: str, *, field: str | None = "file"):
        super().__init__(reason, code=code, field=field, status=_STATUS.get(code, 400))

    @property
    def reason(self) -> str:
        return self.message


def kind_of(filename: str) -> str:
    """The kind for a file name's extension, or a 415 naming what is accepted."""
    kind = EXTENSIONS.get(Path(filename).suffix.lower())
    if kind is None:
        accepted = ", ".join(sorted(EXTENSIONS))
        raise IngestError(
            "unsupported_type", f"unsupported file type '{Path(filename).suffix}'; accepted: {accepted}"
        )
    return kind


def is_supported(filename: str) -> bool:
    return Path(filename).suffix.lower() in EXTENSIONS


def sniff(path: Path, kind: str) -> None:
    """Check that the bytes look like the kind the extension claims; refuse empty files."""
    size = path.stat().st_size
    if size == 0:
        raise IngestError("empty", "the file is empty")
    with open(path, "rb") as fh:
        head = fh.read(8192)
    if kind == "pdf":
        # The header may follow some junk bytes; PDF readers accept it within the first KiB.
        if b"%PDF-" not in head[:1024]:
            raise IngestError("unsupported_type", "the file has a .pdf name but is not a PDF")
    elif kind in _OOXML_PART:
        if not head.startswith(b"PK\x03\x04") or not zipfile.is_zipfile(path):
            raise IngestError(
                "unsupported_type", f"the file has a .{kind} name but is not an Office {kind} file"
            )
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
        if "[Content_Types].xml" not in names or not any(n.startswith(_OOXML_PART[kind]) for n in names):
            raise IngestError(
                "unsupported_type", f"the file has a .{kind} name but is not an Office {kind} file"
            )
    elif kind in _ZIP_MIMETYPE:
        if not head.startswith(b"PK\x03\x04") or not zipfile.is_zipfile(path):
            raise IngestError("unsupported_type", f"the file has a .{kind} name but is not a {kind} package")
        with zipfile.ZipFile(path) as zf:
            try:
                mimetype = zf.read("mimetype").strip() if zf.getinfo("mimetype").file_size < 200 else b""
            except KeyError:
                mimetype = b""
        if mimetype != _ZIP_MIMETYPE[kind]:
            raise IngestError("unsupported_type", f"the file has a .{kind} name but is not a {kind} package")
    elif kind in _OLE_KINDS:
        if not head.startswith(_OLE_MAGIC):
            raise IngestError("unsupported_type", f"the file has a .{kind} name but is not a {kind} file")
    elif kind in _IMAGE_MAGIC or kind == "webp":
        ok = (
            head.startswith(_IMAGE_MAGIC[kind])
            if kind in _IMAGE_MAGIC
            else head[:4] == b"RIFF" and head[8:12] == b"WEBP"
        )
        if not ok:
            raise IngestError("unsupported_type", f"the file has a .{kind} name but is not a {kind} image")
    elif kind == "rtf":
        if not head.lstrip().startswith(b"{\\rtf"):
            raise IngestError("unsupported_type", "the file has a .rtf name but is not an RTF document")
    elif b"\x00" in head and not _is_utf16(head):
        # Text formats (csv, html, md, txt) never hold NUL bytes; binaries almost always do early on.
        raise IngestError("unsupported_type", f"the file has a .{kind} name but holds binary data, not text")


def _is_utf16(head: bytes) -> bool:
    return head.startswith((b"\xff\xfe", b"\xfe\xff"))


def decode_text(data: bytes) -> str:
    """Text file bytes to str: UTF-8 (with or without BOM), UTF-16 with a BOM, else Windows-1252."""
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode("cp1252", errors="replace")
