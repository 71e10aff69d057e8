"""Request and response shapes of the worker's public API, validated once at the door."""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from contract.answer import Document, Message, Strict, whole_float
from contract.languages import LANGUAGE_TAG_PATTERN, language_hint

from .errors import BadRequest, PayloadTooLarge
from .names import FILENAME_PATTERN, NAME_RE, name_problem
from .settings import Settings


def int_between(low: int, high: int | None = None) -> Any:
    """An Int with bounds the OpenAPI document shows as minimum/maximum."""
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(whole_float)]


Name = Annotated[str, Field(json_schema_extra={"pattern": NAME_RE.pattern})]
FileName = Annotated[str, Field(json_schema_extra={"pattern": FILENAME_PATTERN, "maxLength": 255})]
StopSequence = Annotated[str, Field(min_length=1, max_length=200)]


class Options(Strict):
    # A misspelt switch (`topK`) would otherwise be dropped without a word and the turn run with the default.
    model_config = ConfigDict(extra="forbid")

    route: Literal["auto", "rag", "direct", "sql"] = "auto"
    rewrite: bool | None = None
    hyde: bool | None = None
    rerank: bool | None = None
    mode: Literal["hybrid", "vector", "fts"] | None = None
    top_k: int_between(1, 50) | None = None
    provenance: Literal["rerank", "similarity", "none"] | None = None
    model: str | None = Field(default=None, max_length=200)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    max_tokens: int_between(1, 8192) | None = None
    # Generation ends before the first of these (OpenAI's `stop`); the text up to it is the reply.
    stop: list[StopSequence] | None = Field(default=None, max_length=4)
    prompts: dict[str, str] | None = None
    grounding: Literal["flag", "extract", "refuse"] | None = None
    answer_mode: Literal["auto", "extractive"] | None = None
    # The interface's language (ISO 639-1 or BCP-47; kept: its ISO 639-1 code): the answer's and the fixed texts'
    # language when the latest message is too short or unsure to detect. A surely detected message still wins.
    language: str | None = Field(
        default=None,
        max_length=35,
        pattern=LANGUAGE_TAG_PATTERN,
        description="the interface's language (fr, fr-CA): used only when the latest message's language is "
        "too short or unsure to detect; a surely detected language wins",
    )

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        return None if value is None else language_hint(value)


def option_defaults(settings: Settings) -> dict[str, Any]:
    """What an option left unset means on this worker: the one source of `resolve_options` and `/config`."""
    has_reranker = bool(settings.reranker_model)
    return {
        "route": Options.model_fields["route"].default,
        "rewrite": True,
        "hyde": False,
        "rerank": has_reranker,
        "mode": "hybrid",
        "top_k": settings.top_k,
        "provenance": "rerank" if has_reranker else "similarity",
        "temperature": None,
    }


class ChatRequest(Strict):
    prompt: str = Field(
        validation_alias=AliasChoices("prompt", "query"),
        # Checked by check_chat_limits (MAX_PROMPT_CHARS); published so clients know before they send.
        json_schema_extra={"minLength": 1, "maxLength": 8000, "pattern": r"\S"},
    )
    history: list[Message] = Field(default_factory=list)
    docs: list[Document] = Field(default_factory=list)
    datasets: list[Name] = Field(default_factory=list)
    index: Name | Annotated[list[Name], Field(json_schema_extra={"minItems": 1})] = "default"
    options: Options = Field(default_factory=Options)

    @field_validator("datasets")
    @classmethod
    def _datasets(cls, value: list[str]) -> list[str]:
        _check_names(value, "dataset")
        return list(dict.fromkeys(value))

    @field_validator("index")
    @classmethod
    def _index(cls, value: str | list[str]) -> str | list[str]:
        names = [value] if isinstance(value, str) else value
        if not names:
            raise ValueError("give at least one index name")
        _check_names(names, "index")
        return value

    @property
    def indexes(self) -> list[str]:
        return list(dict.fromkeys([self.index] if isinstance(self.index, str) else self.index))


def _check_names(names: list[str], kind: str) -> None:
    for name in names:
        if problem := name_problem(name, kind):
            raise ValueError(problem)


class TitleRequest(Strict):
    question: str = Field(min_length=1, max_length=8000)


def _field_path(loc: tuple) -> str:
    parts = [str(p) for p in loc if p not in ("function-after",)]
    return ".".join(parts)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds (itself, or inside Optional, Annotated, list, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if found := _model_in(arg):
            return found
    return None


def _keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the model holding the last key of `loc` accepts."""
    current: type[BaseModel] | None = model
    for part in loc[:-1]:
        if isinstance(part, int) or current is None:
            continue  # a list's item: the annotation already led to the item's model
        field = current.model_fields.get(part)
        current = _model_in(field.annotation) if field else None
    return list(current.model_fields) if current else []


def _squashed(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def unknown_key(model: type[BaseModel], loc: tuple) -> BadRequest:
    """A 400 naming a key the model does not accept, with the key meant when it differs only in case or
    separators (`topK`: top_k), else the keys it accepts."""
    field, key = _field_path(loc), str(loc[-1])
    known = _keys_at(model, loc)
    meant = next((k for k in known if _squashed(k) == _squashed(key)), None)
    if meant:
        hint = f"did you mean '{meant}'?"
    else:
        hint = "known: " + ", ".join(known)
    return BadRequest(f"{field}: unknown option '{key}'; {hint}", code="unknown_option", field=field)


def parse(model: type[BaseModel], payload: Any) -> Any:
    """Validate a JSON body into `model`, turning pydantic's report into one clear 400."""
    if not isinstance(payload, dict):
        raise BadRequest("the request body must be a JSON object", code="bad_json")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = _field_path(first["loc"])
        kind = first["type"]
        msg = first["msg"].removeprefix("Value error, ")
        if kind == "missing":
            raise BadRequest(f"{field} is required", code="missing_field", field=field) from None
        if kind == "extra_forbidden":
            raise unknown_key(model, first["loc"]) from None
        raise BadRequest(f"{field}: {msg}", code="invalid_field", field=field) from None


def check_chat_limits(req: ChatRequest, settings: Settings) -> None:
    """Size limits from the settings: a prompt out of range is a 400, oversized history or docs a 413."""
    if not req.prompt.strip():
        raise BadRequest("prompt must not be empty", code="invalid_field", field="prompt")
    if len(req.prompt) > settings.max_prompt_chars:
        raise BadRequest(
            f"prompt is longer than {settings.max_prompt_chars} characters",
            code="invalid_field",
            field="prompt",
        )
    if len(req.history) > settings.max_history_messages:
        raise PayloadTooLarge(
            f"history has {len(req.history)} messages; the limit is {settings.max_history_messages}",
            field="history",
        )
    chars = sum(len(m.content) for m in req.history)
    if chars > settings.max_history_chars:
        raise PayloadTooLarge(
            f"history holds {chars} characters; the limit is {settings.max_history_chars}", field="history"
        )
    if len(req.docs) > settings.max_docs:
        raise PayloadTooLarge(f"{len(req.docs)} docs sent; the limit is {settings.max_docs}", field="docs")
