"""The Outlook sample the tests make (tests/msg_writer.py) is a real .msg: two independent readers of the
compound-file and message formats read it, and the converter turns it into a message with its attachments."""

from __future__ import annotations

import io

import olefile

from rag_worker.ingest.convert import Converter
from tests.format_samples import MSG_TABLE, PHRASES, msg_bytes


def test_the_sample_is_a_compound_file_with_outlooks_message_layout():
    data = msg_bytes()
    assert olefile.isOleFile(io.BytesIO(data))
    with olefile.OleFileIO(io.BytesIO(data)) as ole:
        streams = {"/".join(path) for path in ole.listdir()}
        assert "__properties_version1.0" in streams
        assert "__substg1.0_001A001F" in streams  # the message class
        assert (
            "__attach_version1.0_#00000001/__substg1.0_37010102" in streams
        )  # the second attachment's bytes
        assert ole.openstream("__substg1.0_001A001F").read().decode("utf-16-le") == "IPM.Note"


def test_extract_msg_reads_the_sample_strictly(tmp_path):
    import extract_msg

    path = tmp_path / "audit.msg"
    path.write_bytes(msg_bytes())
    msg = extract_msg.openMsg(str(path), strict=True)  # strict: refuses anything but a message
    try:
        assert msg.subject == "Bell tower audit"
        assert msg.sender == "Grace Hopper <grace@example.org>"
        assert msg.to == "Alan Turing <alan@example.org>"
        assert PHRASES["msg"] in msg.body
        assert [(a.longFilename, a.data) for a in msg.attachments][1] == (
            "ward costs.csv",
            MSG_TABLE.encode(),
        )
    finally:
        msg.close()


def test_the_converter_reads_headers_body_and_attachments(tmp_path):
    path = tmp_path / "audit.msg"
    path.write_bytes(msg_bytes())
    converted = Converter().convert(path)
    assert converted.kind == "msg"
    text = converted.document.export_to_markdown()
    assert PHRASES["msg"] in text and "Bell tower audit" in text
    assert converted.metadata["email"]["from"] == "Grace Hopper <grace@example.org>"
    assert converted.metadata["email"]["date"].startswith("2024-05-06 09:30")
    assert [name for name, _ in converted.attachments] == ["appendix.txt", "ward costs.csv"]
