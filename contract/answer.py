"""One turn's answer, typed once: the worker's `done` event, the gateway's stored message and its API.

Every answer model allows extra fields: a field the worker adds passes through the gateway untouched until it
is typed here, so adding to the contract never breaks a client. `Message` and `Document` are also request
shapes (the history and the documents in hand a client sends back), so they are strict about types.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


def whole_float(value: Any) -> Any:
    # JSON Schema counts 3.0 as an integer; strict pydantic would refuse it. 3.5 stays an error.
    return int(value) if isinstance(value, float) and value.is_integer() else value


Int = Annotated[int, BeforeValidator(whole_float)]

Role = Literal["user", "assistant", "system"]
Route = Literal["rag", "direct", "sql"]


class Strict(BaseModel):
    # Unknown fields are ignored (forward compatibility); wrong types are an error, not a silent coercion.
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(Strict):
    role: Role
    content: str


class Location(BaseModel):
    """Where a passage is in its original (rag_worker/ingest/locations.py); every field optional, as an index
    built before locations has none and each kind of file fills its own."""

    model_config = ConfigDict(extra="allow")

    label: str | None = Field(
        default=None,
        max_length=1000,
        description="as a citation shows it: p. 3, pp. 3–4, Sheet 'Wards', rows 12–40, Slide 4, Intro › Setup",
    )
    pages: list[Int] | None = None
    boxes: list[list[float]] | None = Field(
        default=None,
        description="PDF: [page, x0, y0, x1, y1] per box, fractions of the page, origin top left",
    )
    ocr: bool | None = Field(default=None, description="the boxes are the OCR's line boxes on a scanned page")
    sheet: str | None = None
    rows: list[Int] | None = Field(default=None, description="[first, last] as the sheet numbers its rows")
    parts: list[dict[str, Any]] | None = None
    slide: Int | None = None
    slides: list[Int] | None = None
    headings: list[str] | None = None


class Document(Strict):
    """A retrieved passage (or the `sql` route's computed table), as shown and as sent back next turn."""

    id: str
    document_id: str = ""
    filename: str = ""
    dataset: str = "default"
    index: str | None = None
    page: Int | None = None
    chunk_index: Int | None = None
    location: Location | None = None
    text: str
    context: str | None = None
    score: float | None = None
    vector_score: float | None = None
    fts_score: float | None = None
    rerank_score: float | None = None
    provenance: float | None = None
    rank: Int | None = None
    ref: str | None = None
    # A computed result of the `sql` route: kind "table", the query, its columns and rows.
    kind: str | None = Field(default=None, max_length=32)
    query: str | None = Field(default=None, max_length=20_000)
    columns: list[str] | None = None
    rows: list[list[Any]] | None = None
    truncated: bool | None = None
    tables: list[str] | None = None


class Citation(Open):
    ref: str
    id: str
    filename: str
    page: int | None = None
    location: Location | None = None


class GroundedSentence(Open):
    text: str
    label: Literal["supported", "weak", "unsupported"]
    score: float
    refs: list[str] = Field(default_factory=list)


class Grounding(Open):
    """Each answer sentence checked against the passages the model read."""

    supported_share: float = Field(ge=0, le=1)
    supported: int
    checked: int
    policy: Literal["flag", "extract", "refuse"] | None = None
    answer_mode: Literal["generated", "extractive"] | None = None
    action: Literal["none", "flagged", "extracted", "refused"] | None = None
    sentences: list[GroundedSentence]


class Step(Open):
    step: str
    label: str
    elapsed_ms: int
    method: str | None = Field(
        default=None, description="which path decided: retrieval_score, similarity, llm, ..."
    )
    detail: dict[str, Any] | None = None


class AnswerLanguage(Open):
    code: str = Field(description="ISO 639-1: the language the answer and its fixed texts were asked in")
    source: Literal["detected", "hinted", "guessed", "fallback"] = Field(
        description="detected: the latest message's, surely; hinted: the message too short or unsure to tell, "
        "the request's options.language (the interface's); guessed: unsure and no hint, the detector's best "
        "guess; fallback: nothing to go on, English"
    )


class Answer(Open):
    """`POST /chat`'s answer, the `done` event of `/chat_stream`, and what the gateway stores per answer."""

    reply: str
    question: str
    rewritten: str | None = Field(
        default=None,
        description="the follow-up question rewritten to stand alone (from the history), when it was; null when "
        "the question was searched as asked. Never the relevance check's retry: see retried_query",
    )
    retried_query: str | None = Field(
        default=None,
        description="the query of the relevance check's second search, when the documents shown came from it "
        "(the first search found too little); null when no retry ran, the first search's passages were kept, or "
        "the turn abstained. The documents came from retried_query, else rewritten, else question; "
        "flags.retried records every retry, kept or not",
    )
    history: list[Message] = Field(description="send it back unchanged next turn")
    documents: list[Document]
    fetched_new_documents: bool
    route: Route
    citations: list[Citation]
    abstained: bool
    model: str
    llm_backend: str | None = None
    flags: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, int | str] = Field(
        default_factory=dict,
        description="milliseconds per stage (`<stage>_ms`, `first_token_ms`, `total_ms`, ...); `trace_id` "
        "(32 hex digits) when the worker exports traces",
    )
    grounding: Grounding | None = Field(
        default=None, description="null: no sources (direct or sql route, or abstained)"
    )
    language: AnswerLanguage | None = Field(
        default=None, description="the answer's language and why it was chosen; null from an older worker"
    )
