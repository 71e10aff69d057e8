"""OCR throughput: scanned pages per second through the converter, against text-layer pages in the same run.

    .venv/bin/python -m bench.ocr_throughput [--pages 10]

Renders `--pages` pages of English prose (Pillow, 200 dpi, A4) into an image-only PDF and converts it (every page
goes through Tesseract), then converts Docling's multi_page.pdf fixture (text layer, no OCR) as the baseline.
Prints pages per second and the word recall of the OCR text against the rendered prose.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from tests.servers import SHARED

PROSE = (
    "The committee met on a wet Tuesday to review the harbour accounts. Receipts from the ferry rose by a "
    "third while the cost of fuel fell slightly. Two wardens retired after long service and the board thanked "
    "them. The new pier will open in spring if the weather allows the final concrete to cure. Members asked "
    "for a report on the lighthouse lamps, which still burn paraffin in the winter months."
)
WORD = re.compile(r"[a-z]+")


def page_image(number: int):
    from PIL import Image, ImageDraw, ImageFont

    image = Image.new("L", (1654, 2339), 255)  # A4 at 200 dpi
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=34)
    y = 120
    words = f"Page {number}. {PROSE} {PROSE}".split()
    line: list[str] = []
    for word in words:
        if draw.textlength(" ".join([*line, word]), font=font) > 1400:
            draw.text((120, y), " ".join(line), fill=0, font=font)
            y, line = y + 52, []
        line.append(word)
    draw.text((120, y), " ".join(line), fill=0, font=font)
    return image


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", type=int, default=10)
    args = ap.parse_args()
    from rag_worker.ingest.convert import Converter

    converter = Converter()
    converter.prepare()
    with tempfile.TemporaryDirectory() as tmp:
        scan = Path(tmp) / "scan.pdf"
        images = [page_image(i + 1) for i in range(args.pages)]
        images[0].save(scan, "PDF", resolution=200, save_all=True, append_images=images[1:])
        t0 = time.perf_counter()
        converted = converter.convert(scan)
        ocr_s = time.perf_counter() - t0
    text = converted.document.export_to_markdown().lower()
    truth = set(WORD.findall(PROSE.lower()))
    recall = len(truth & set(WORD.findall(text))) / len(truth)
    native = SHARED / "fixtures" / "docling" / "sources" / "multi_page.pdf"
    t0 = time.perf_counter()
    base = converter.convert(native)
    native_s = time.perf_counter() - t0
    print(
        f"OCR:    {args.pages} scanned pages in {ocr_s:.1f} s = {args.pages / ocr_s:.2f} pages/s "
        f"({ocr_s / args.pages:.2f} s/page); word recall {recall:.3f}; OCR'd pages {len(converted.metadata['ocr_pages'])}"
    )
    print(
        f"native: {base.pages} text-layer pages in {native_s:.2f} s = {base.pages / native_s:.1f} pages/s (baseline)"
    )


if __name__ == "__main__":
    main()
