"""Attachment document names: the message's prefix and the attachment's extension survive a name past 255 bytes."""

from __future__ import annotations

from rag_worker.ingest.attachments import attachment_name, belongs_to_a_message


def test_a_short_name_is_the_message_name_dot_the_attachment_name():
    assert attachment_name("memo.eml", "budget.xlsx") == "memo.eml.budget.xlsx"


def test_a_long_name_is_cut_in_its_own_stem_keeping_prefix_and_extension():
    for stem in ("contract-" + "x" * 300, "vertrag-" + "ä" * 200):
        name = attachment_name("memo.eml", f"{stem}.txt")
        assert name is not None and len(name.encode("utf-8")) <= 255, name
        assert name.startswith("memo.eml." + stem[:8]) and name.endswith(".txt"), name
        assert belongs_to_a_message(name, {"memo.eml"})


def test_a_message_name_too_long_to_prefix_anything_names_no_document():
    assert attachment_name("m" * 250 + ".eml", "budget.xlsx") is None
