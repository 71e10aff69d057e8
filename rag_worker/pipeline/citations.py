"""Citation markers in the answer: keep those naming a real document, drop the invented ones."""

from __future__ import annotations

import re

GROUP_RE = re.compile(r"\[((?:S\d+)(?:\s*[,;]\s*S\d+)*)\]")
REF_RE = re.compile(r"S\d+")


def validate(reply: str, documents: list[dict]) -> tuple[str, list[dict], list[str]]:
    """Returns (reply without invented refs, citations in order of first use, the invented refs)."""
    by_ref = {d["ref"]: d for d in documents if d.get("ref")}
    cited: dict[str, dict] = {}
    invented: list[str] = []

    def keep(match: re.Match) -> str:
        refs = REF_RE.findall(match.group(1))
        valid = [r for r in refs if r in by_ref]
        invented.extend(r for r in refs if r not in by_ref)
        for r in valid:
            d = by_ref[r]
            citation = {"ref": r, "id": d["id"], "filename": d["filename"], "page": d.get("page")}
            if d.get("location"):  # an index built before locations has none
                citation["location"] = d["location"]
            cited.setdefault(r, citation)
        return "[" + ", ".join(valid) + "]" if valid else ""

    cleaned = GROUP_RE.sub(keep, reply)
    if invented:
        cleaned = re.sub(r"[ \t]+([.,;:!?])", r"\1", cleaned)
        cleaned = re.sub(r"[ \t]{2,}", " ", cleaned)
    return cleaned, list(cited.values()), list(dict.fromkeys(invented))
