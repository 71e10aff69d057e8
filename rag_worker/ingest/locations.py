"""Where a chunk came from, precisely enough to open the original there (the web's source viewer).

Every chunk gets a `location` (kept in its row's metadata, so tables written before it need no new column and a
rebuild adds it):

- PDF: `pages`, and `boxes` [[page, x0, y0, x1, y1], ...] from Docling's provenance (the native pipeline's text
  cells; on scanned pages Tesseract's line boxes, rag_worker/ingest/convert.add_page_texts), as fractions of
  the page's width and height with the origin at the top left (PDF.js multiplies them by its viewport);
- spreadsheet: `sheet` and `rows` [first, last] as the sheet numbers them (1-based, the header row included),
  from the table's cell box; a chunk that merged tables of several sheets lists each in `parts`;
- presentation: `slide`;
- text formats (Markdown, HTML, Word, e-mail, plain text): `headings`, the section path.

`label` is what a citation shows: "p. 3", "pp. 3–4", "Sheet 'Wards', rows 12–40", "Slide 4", "Intro › Setup".
"""

from __future__ import annotations

from docling_core.types.doc import CoordOrigin, DoclingDocument, GroupLabel, RefItem, TableItem

PRESENTATION = (".pptx", ".ppt", ".odp")


class Locator:
    """Locations of one document's chunks, in chunk order (a table split over chunks is followed row by row)."""

    def __init__(self, doc: DoclingDocument):
        self.doc = doc
        origin = getattr(doc.origin, "filename", "") or ""
        self.slides = origin.lower().endswith(PRESENTATION)
        self.pdf = origin.lower().endswith(".pdf")
        self.sheets = _sheet_names(doc)
        self.csv = origin.lower().endswith(".csv")
        self._rows_used: dict[str, int] = {}  # a split table's data rows already cited by earlier chunks

    def locate(self, doc_items: list, text: str, headings: list[str], pages: list[int]) -> dict | None:
        doc_items = [self._resolve(i) for i in doc_items]
        if self.sheets or self.csv or (not self.slides and not self.pdf and self._cell_boxes(doc_items)):
            sheet = self._sheet_location(doc_items, text)
            if sheet:
                return sheet
        if self.slides and pages:
            return {
                "slide": pages[0],
                "label": f"Slide {pages[0]}" + (f"–{pages[-1]}" if len(pages) > 1 else ""),
            }
        if pages and self.pdf:
            return self._pdf_location(doc_items, pages)
        if headings:
            return {"headings": headings, "label": " › ".join(headings)}
        if pages:
            return {"pages": pages, "label": page_label(pages)}
        return None

    def _resolve(self, item):
        """The document's own item (a chunk's meta may hold a plain DocItem copy of it)."""
        try:
            return RefItem(cref=item.self_ref).resolve(self.doc)
        except Exception:  # a ref the document does not hold: keep the copy
            return item

    def _pdf_location(self, doc_items: list, pages: list[int]) -> dict:
        boxes = []
        ocr = False
        for item in doc_items:
            for prov in item.prov or []:
                page = self.doc.pages.get(prov.page_no)
                if page is None or not page.size.width or not page.size.height:
                    continue
                width, height = page.size.width, page.size.height
                box = prov.bbox
                if box.coord_origin == CoordOrigin.BOTTOMLEFT:
                    box = box.to_top_left_origin(page_height=height)
                else:
                    ocr = True  # the native pipeline's cells are bottom-left; add_page_texts writes top-left
                x0, x1 = sorted((box.l / width, box.r / width))
                y0, y1 = sorted((box.t / height, box.b / height))
                if x1 - x0 >= 0.999 and y1 - y0 >= 0.999:
                    continue  # the whole page: an OCR paragraph read without boxes says nothing
                boxes.append([prov.page_no, *(round(min(max(v, 0.0), 1.0), 4) for v in (x0, y0, x1, y1))])
        location: dict = {"pages": pages, "label": page_label(pages), "boxes": boxes}
        if ocr:
            location["ocr"] = True
        return location

    def _cell_boxes(self, doc_items: list) -> list:
        return [
            p
            for i in doc_items
            if isinstance(i, TableItem)
            for p in i.prov or []
            if p.bbox.coord_origin == CoordOrigin.TOPLEFT
        ]

    def _sheet_location(self, doc_items: list, text: str) -> dict | None:
        tables = [i for i in doc_items if isinstance(i, TableItem) and (i.prov or self.csv)]
        if not tables:
            return None
        parts = []
        split = len(tables) == 1 and len(doc_items) == 1  # one table's rows, maybe split over chunks
        for table in tables:
            prov = table.prov[0] if table.prov else None
            if prov is not None:
                first, last = (
                    int(prov.bbox.t) + 1,
                    int(prov.bbox.b),
                )  # the cell box: rows [t, b) counted from 0
            else:  # a CSV file is one table from its first line
                first, last = 1, table.data.num_rows
            if split:
                rows = _data_rows(text)
                used = self._rows_used.get(table.self_ref, 0)
                total = max(last - first, 0)  # data rows below the header
                if rows and used + rows <= total:
                    start = first + 1 + used  # the header is the table's first row
                    first, last = (first if used == 0 else start), start + rows - 1
                    self._rows_used[table.self_ref] = used + rows
            sheet = self.sheets.get(prov.page_no) if prov is not None else None
            parts.append({"sheet": sheet, "rows": [first, max(first, last)]})
        head = parts[0]
        label = rows_label(head["sheet"], head["rows"])
        if len(parts) > 1:
            label += f" and {len(parts) - 1} more table{'s' if len(parts) > 2 else ''}"
        location = {"sheet": head["sheet"], "rows": head["rows"], "label": label}
        if len(parts) > 1:
            location["parts"] = parts
        return location


def _sheet_names(doc: DoclingDocument) -> dict[int, str]:
    """Page number (Docling numbers sheets as pages) -> sheet name; empty for a document without sheets."""
    names: dict[int, str] = {}
    for group in doc.groups:
        if group.label != GroupLabel.SHEET:
            continue
        for child in group.children:
            item = child.resolve(doc)
            prov = getattr(item, "prov", None)
            if prov:
                names.setdefault(prov[0].page_no, group.name)
                break
    return names


def _data_rows(text: str) -> int:
    """Data rows of a Markdown table chunk: its table lines but the header and the separator."""
    lines = [ln for ln in text.splitlines() if ln.lstrip().startswith("|")]
    return max(len(lines) - 2, 0)


def page_label(pages: list[int]) -> str:
    return f"p. {pages[0]}" if len(pages) == 1 else f"pp. {pages[0]}–{pages[-1]}"


def rows_label(sheet: str | None, rows: list[int]) -> str:
    span = f"row {rows[0]}" if rows[0] == rows[1] else f"rows {rows[0]}–{rows[1]}"
    return f"Sheet '{sheet}', {span}" if sheet else span[0].upper() + span[1:]
