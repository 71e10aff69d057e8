"""Writes Outlook `.msg` files for the tests: a small compound-file writer (MS-CFB, version 3) and the message
layout Outlook uses inside it (MS-OXMSG: property streams, recipient and attachment storages).

Why here: no installed package writes `.msg` (extract-msg and olefile only read; olefile cannot create a file),
no sample ships with them, and a message from someone's mailbox is not ours to redistribute. The files this
writes are read back by extract-msg (what the worker uses) and by olefile, two independent readers of the
format, in tests/unit/test_msg_sample.py.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from datetime import UTC, datetime

SECTOR = 512
MINI_SECTOR = 64
MINI_CUTOFF = 4096
FREESECT, ENDOFCHAIN, FATSECT = 0xFFFFFFFF, 0xFFFFFFFE, 0xFFFFFFFD
NOSTREAM = 0xFFFFFFFF
STORAGE, STREAM, ROOT = 1, 2, 5


@dataclass
class _Entry:
    name: str
    kind: int
    data: bytes = b""
    children: list[_Entry] = field(default_factory=list)
    # filled in while writing
    sid: int = 0
    left: int = NOSTREAM
    right: int = NOSTREAM
    child: int = NOSTREAM
    start: int = ENDOFCHAIN
    size: int = 0


def _sort_key(entry: _Entry) -> tuple[int, str]:
    # MS-CFB 2.6.4: shorter names first, then by upper-cased UTF-16 code units
    return (len(entry.name), entry.name.upper())


def _flatten(root: _Entry) -> list[_Entry]:
    entries: list[_Entry] = []

    def visit(entry: _Entry) -> None:
        entry.sid = len(entries)
        entries.append(entry)
        for child in entry.children:
            visit(child)

    visit(root)

    def tree(nodes: list[_Entry]) -> int:  # a balanced binary search tree of siblings; its root's id
        if not nodes:
            return NOSTREAM
        mid = len(nodes) // 2
        node = nodes[mid]
        node.left, node.right = tree(nodes[:mid]), tree(nodes[mid + 1 :])
        return node.sid

    for entry in entries:
        if entry.children:
            entry.child = tree(sorted(entry.children, key=_sort_key))
    return entries


def compound_file(root_children: list[_Entry]) -> bytes:
    """A compound file whose root storage holds `root_children` (streams and storages)."""
    root = _Entry("Root Entry", ROOT, children=root_children)
    entries = _flatten(root)
    streams = [e for e in entries if e.kind == STREAM]

    # Small streams go to the mini stream (64-byte sectors), itself stored as the root entry's data.
    mini = bytearray()
    minifat: list[int] = []
    big: list[_Entry] = []
    for s in streams:
        s.size = len(s.data)
        if s.size == 0:
            s.start = ENDOFCHAIN
        elif s.size < MINI_CUTOFF:
            n = -(-s.size // MINI_SECTOR)
            s.start = len(minifat)
            minifat.extend(range(s.start + 1, s.start + n))
            minifat.append(ENDOFCHAIN)
            mini += s.data + b"\0" * (n * MINI_SECTOR - s.size)
        else:
            big.append(s)

    sectors: list[bytes] = []
    fat: list[int] = []

    def place(data: bytes, marker: int | None = None) -> int:
        n = max(1, -(-len(data) // SECTOR))
        first = len(sectors)
        padded = data + b"\0" * (n * SECTOR - len(data))
        for i in range(n):
            sectors.append(padded[i * SECTOR : (i + 1) * SECTOR])
            fat.append(marker if marker is not None else (first + i + 1 if i < n - 1 else ENDOFCHAIN))
        return first

    for s in big:
        s.start = place(s.data)
    root.size = len(mini)
    root.start = place(bytes(mini)) if mini else ENDOFCHAIN
    minifat_start = ENDOFCHAIN
    minifat_count = 0
    if minifat:
        raw = struct.pack(f"<{len(minifat)}I", *minifat)
        raw += struct.pack("<I", FREESECT) * ((-len(minifat)) % (SECTOR // 4))
        minifat_start = place(raw)
        minifat_count = len(raw) // SECTOR

    directory = b"".join(_dir_entry(e) for e in entries)
    directory += _dir_entry(None) * ((-len(entries)) % (SECTOR // 128))
    dir_start = place(directory)

    # The FAT describes every sector, its own included.
    per_fat = SECTOR // 4
    fat_count = 1
    while fat_count * per_fat < len(sectors) + fat_count:
        fat_count += 1
    if fat_count > 109:
        raise ValueError("too large for a header-only DIFAT")
    fat_first = len(sectors)
    fat.extend([FATSECT] * fat_count)
    fat.extend([FREESECT] * (fat_count * per_fat - len(fat)))
    table = struct.pack(f"<{len(fat)}I", *fat)
    for i in range(fat_count):
        sectors.append(table[i * SECTOR : (i + 1) * SECTOR])

    header = bytearray(SECTOR)
    header[0:8] = bytes.fromhex("D0CF11E0A1B11AE1")
    struct.pack_into("<HHHHH", header, 0x18, 0x003E, 0x0003, 0xFFFE, 9, 6)
    struct.pack_into("<I", header, 0x28, 0)  # directory sectors: 0 in version 3
    struct.pack_into("<I", header, 0x2C, fat_count)
    struct.pack_into("<I", header, 0x30, dir_start)
    struct.pack_into("<I", header, 0x34, 0)
    struct.pack_into("<I", header, 0x38, MINI_CUTOFF)
    struct.pack_into("<I", header, 0x3C, minifat_start)
    struct.pack_into("<I", header, 0x40, minifat_count)
    struct.pack_into("<I", header, 0x44, ENDOFCHAIN)  # no DIFAT sectors
    struct.pack_into("<I", header, 0x48, 0)
    difat = [fat_first + i for i in range(fat_count)] + [FREESECT] * (109 - fat_count)
    struct.pack_into("<109I", header, 0x4C, *difat)
    return bytes(header) + b"".join(sectors)


def _dir_entry(entry: _Entry | None) -> bytes:
    out = bytearray(128)
    if entry is None:  # an unused entry
        struct.pack_into("<III", out, 0x44, NOSTREAM, NOSTREAM, NOSTREAM)
        return bytes(out)
    name = entry.name.encode("utf-16-le")
    if len(name) > 62:
        raise ValueError(f"name too long: {entry.name}")
    out[0 : len(name)] = name
    struct.pack_into("<HBB", out, 0x40, len(name) + 2, entry.kind, 1)  # 1: black
    struct.pack_into("<III", out, 0x44, entry.left, entry.right, entry.child)
    struct.pack_into("<IQ", out, 0x74, entry.start if entry.kind != STORAGE else 0, entry.size)
    return bytes(out)


# -- the Outlook message inside (MS-OXMSG) ------------------------------------------------------------------------

PT_LONG, PT_SYSTIME, PT_UNICODE, PT_BINARY = 0x0003, 0x0040, 0x001F, 0x0102
PROP_READABLE_WRITABLE = 0x00000006
STORE_UNICODE_OK = 0x00040000


def _filetime(when: datetime) -> int:
    return int((when - datetime(1601, 1, 1, tzinfo=UTC)).total_seconds() * 10_000_000)


def _properties(header: bytes, props: list[tuple[int, int, object]]) -> tuple[_Entry, list[_Entry]]:
    """The `__properties_version1.0` stream of one object and the streams of its variable-length properties.

    `props`: (property id, type, value); strings are stored as UTF-16LE streams, binaries as bytes."""
    fixed = bytearray(header)
    streams: list[_Entry] = []
    for prop_id, ptype, value in props:
        tag = (prop_id << 16) | ptype
        if ptype == PT_UNICODE:
            data = str(value).encode("utf-16-le")  # the stream has no terminator; the size counts one
            streams.append(_Entry(f"__substg1.0_{tag:08X}", STREAM, data))
            fixed += struct.pack("<IIII", tag, PROP_READABLE_WRITABLE, len(data) + 2, 0)
        elif ptype == PT_BINARY:
            data = bytes(value)  # type: ignore[arg-type]
            streams.append(_Entry(f"__substg1.0_{tag:08X}", STREAM, data))
            fixed += struct.pack("<IIII", tag, PROP_READABLE_WRITABLE, len(data), 0)
        elif ptype == PT_LONG:
            fixed += struct.pack("<IIiI", tag, PROP_READABLE_WRITABLE, int(value), 0)  # type: ignore[call-overload]
        elif ptype == PT_SYSTIME:
            fixed += struct.pack("<IIQ", tag, PROP_READABLE_WRITABLE, _filetime(value))  # type: ignore[arg-type]
        else:
            raise ValueError(f"property type {ptype:#06x} not written here")
    return _Entry("__properties_version1.0", STREAM, bytes(fixed)), streams


@dataclass
class Recipient:
    name: str
    address: str
    kind: int = 1  # MAPI_TO


def msg_bytes(
    *,
    sender: tuple[str, str],
    to: list[Recipient],
    subject: str,
    body: str,
    sent: datetime,
    attachments: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
) -> bytes:
    """An Outlook message (IPM.Note, Unicode strings) with plain-text body and attachments by value."""
    name, address = sender
    headers = (
        f"From: {name} <{address}>\r\n"
        f"To: {', '.join(f'{r.name} <{r.address}>' for r in to)}\r\n"
        f"Subject: {subject}\r\n"
        f"Date: {sent.strftime('%a, %d %b %Y %H:%M:%S +0000')}\r\n"
        "MIME-Version: 1.0\r\n\r\n"
    )
    top_header = struct.pack("<8xIIII8x", len(to), len(attachments), len(to), len(attachments))
    props, streams = _properties(
        top_header,
        [
            (0x001A, PT_UNICODE, "IPM.Note"),  # PR_MESSAGE_CLASS
            (0x0037, PT_UNICODE, subject),  # PR_SUBJECT
            (0x1000, PT_UNICODE, body),  # PR_BODY
            (0x0C1A, PT_UNICODE, name),  # PR_SENDER_NAME
            (0x0C1F, PT_UNICODE, address),  # PR_SENDER_EMAIL_ADDRESS
            (0x0C1E, PT_UNICODE, "SMTP"),  # PR_SENDER_ADDRTYPE
            (0x0042, PT_UNICODE, name),  # PR_SENT_REPRESENTING_NAME
            (0x0E04, PT_UNICODE, "; ".join(r.name for r in to)),  # PR_DISPLAY_TO
            (0x007D, PT_UNICODE, headers),  # PR_TRANSPORT_MESSAGE_HEADERS
            (0x0039, PT_SYSTIME, sent),  # PR_CLIENT_SUBMIT_TIME
            (0x0E06, PT_SYSTIME, sent),  # PR_MESSAGE_DELIVERY_TIME
            (0x0E07, PT_LONG, 1 | (0x10 if attachments else 0)),  # PR_MESSAGE_FLAGS: read, has attachments
            (0x340D, PT_LONG, STORE_UNICODE_OK),  # PR_STORE_SUPPORT_MASK
        ],
    )
    children: list[_Entry] = [props, *streams]
    children.append(
        _Entry(
            "__nameid_version1.0",
            STORAGE,
            children=[
                _Entry("__substg1.0_00020102", STREAM),  # GUIDs
                _Entry("__substg1.0_00030102", STREAM),  # entries
                _Entry("__substg1.0_00040102", STREAM),  # strings
            ],
        )
    )
    for i, r in enumerate(to):
        rprops, rstreams = _properties(
            b"\0" * 8,
            [
                (0x0C15, PT_LONG, r.kind),  # PR_RECIPIENT_TYPE
                (0x3000, PT_LONG, i),  # PR_ROWID
                (0x3001, PT_UNICODE, r.name),  # PR_DISPLAY_NAME
                (0x3002, PT_UNICODE, "SMTP"),  # PR_ADDRTYPE
                (0x3003, PT_UNICODE, r.address),  # PR_EMAIL_ADDRESS
                (0x39FE, PT_UNICODE, r.address),  # PR_SMTP_ADDRESS
            ],
        )
        children.append(_Entry(f"__recip_version1.0_#{i:08X}", STORAGE, children=[rprops, *rstreams]))
    for i, (filename, data) in enumerate(attachments):
        aprops, astreams = _properties(
            b"\0" * 8,
            [
                (0x0E21, PT_LONG, i),  # PR_ATTACH_NUM
                (0x3705, PT_LONG, 1),  # PR_ATTACH_METHOD: ATTACH_BY_VALUE
                (0x3707, PT_UNICODE, filename),  # PR_ATTACH_LONG_FILENAME
                (0x3704, PT_UNICODE, filename[:12]),  # PR_ATTACH_FILENAME
                (0x3001, PT_UNICODE, filename),  # PR_DISPLAY_NAME
                (0x3701, PT_BINARY, data),  # PR_ATTACH_DATA_BIN
            ],
        )
        children.append(_Entry(f"__attach_version1.0_#{i:08X}", STORAGE, children=[aprops, *astreams]))
    return compound_file(children)
