"""Write a BEIR corpus (corpus.jsonl) as one text file per document, ready for `python -m rag_worker index`.

    python scripts/beir_to_files.py ../shared/eval/scifact/corpus.jsonl /tmp/scifact --limit 500
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path, help="a BEIR corpus.jsonl")
    ap.add_argument("out", type=Path, help="folder to write <id>.txt files into (created)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N documents")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(args.corpus, encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            name = re.sub(r"[^A-Za-z0-9_.-]", "_", str(doc["_id"])) + ".txt"
            text = f"{doc.get('title', '').strip()}\n\n{doc.get('text', '').strip()}".strip()
            (args.out / name).write_text(text + "\n", encoding="utf-8")
            written += 1
            if args.limit and written >= args.limit:
                break
    print(f"wrote {written} files to {args.out}")


if __name__ == "__main__":
    main()
