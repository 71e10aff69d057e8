"""Request bodies, validated once at the door into typed objects (a bad one is a 400 naming the field)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.languages import EMBEDDERS, INDEX_LANGUAGES

NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# For the OpenAPI document (gateway/openapi.py): rules the validators below enforce with friendlier messages.
NOT_BLANK = r"\S"  # at least one character that is not white space
# A name: not blank, no control characters.
PLAIN_NAME = r"^[^\x00-\x1f]*[^\x00-\x1f\s][^\x00-\x1f]*$"
# A dataset name, as the worker takes it.
DatasetName = Annotated[str, Field(json_schema_extra={"pattern": NAME_RE.pattern})]
MAX_ID = (
    2**63 - 1
)  # the database's row ids are 64-bit: a larger number names nothing (and SQLite cannot take it)
# A row id in a body (`index_ids`): positive and within the database's integers, else a 400 naming the field.
RowId = Annotated[int, Field(ge=1, le=MAX_ID)]


class Body(BaseModel):
    # Unknown fields are ignored (like the worker); wrong types are a 400, with no coercion (strict, like the
    # worker): `"disabled": 0` or `"temperature": false` is not what the schema says, so it is refused.
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False, strict=True)


class Credentials(Body):
    username: str = Field(min_length=3, max_length=64, pattern=r"^[A-Za-z0-9_.@-]+$")
    password: str = Field(min_length=1, max_length=1024)


class Registration(Credentials):
    password: str = Field(min_length=8, max_length=1024)


class PasswordChange(Body):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=8, max_length=1024)


class UserUpdate(Body):
    disabled: bool


def _dataset_names(values: list[str] | None) -> list[str] | None:
    if values is None:
        return None
    for value in values:
        if not NAME_RE.fullmatch(value):
            raise ValueError(f"dataset {value!r} must be 1 to 64 letters, digits, '_' or '-'")
    return list(dict.fromkeys(values))


class ChatCreate(Body):
    title: str | None = Field(default=None, max_length=200)
    index_ids: list[RowId] = Field(default_factory=list, max_length=50)
    datasets: list[DatasetName] = Field(default_factory=list, max_length=100)

    _check_datasets = field_validator("datasets")(_dataset_names)


class ChatUpdate(Body):
    title: str | None = Field(default=None, max_length=200)
    index_ids: list[RowId] | None = Field(default=None, max_length=50)
    datasets: list[DatasetName] | None = Field(default=None, max_length=100)

    _check_datasets = field_validator("datasets")(_dataset_names)


PROMPT_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


StopSequence = Annotated[str, Field(min_length=1, max_length=200)]
PromptText = Annotated[str, Field(json_schema_extra={"maxLength": 8000})]
# Only names that match: the schema says so (`propertyNames`), the validator below explains.
Prompts = Annotated[
    dict[str, PromptText],
    Field(max_length=20, json_schema_extra={"propertyNames": {"pattern": PROMPT_NAME_RE.pattern}}),
]


class TurnOptions(BaseModel):
    """Per-turn switches sent to the worker: exactly the worker's `options` (WORKER_API.md, its
    rag_worker.schemas.Options, checked field by field in tests) less `route`, which the gate decides.
    Anything else is a 400 naming it, so nothing unchecked reaches the worker."""

    model_config = ConfigDict(extra="forbid", strict=True)

    rewrite: bool | None = None
    hyde: bool | None = None
    rerank: bool | None = None
    mode: Literal["hybrid", "vector", "fts"] | None = None
    top_k: int | None = Field(default=None, ge=1, le=50)
    provenance: Literal["rerank", "similarity", "none"] | None = None
    model: str | None = Field(default=None, max_length=200)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    # The worker's own ceiling; MAX_TOKENS (quotas.check_options) may set a lower one.
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    prompts: Prompts | None = None
    # Issue 16: what to do with an answer the sources don't support, and quotes instead of generation.
    grounding: Literal["flag", "extract", "refuse"] | None = None
    answer_mode: Literal["auto", "extractive"] | None = None
    # Generation ends before the first of these (OpenAI's `stop`).
    stop: list[StopSequence] | None = Field(default=None, max_length=4)

    @field_validator("prompts")
    @classmethod
    def _prompts(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for name, text in (value or {}).items():
            if not PROMPT_NAME_RE.fullmatch(name):
                raise ValueError(f"prompt name {name[:80]!r} must be lowercase letters, digits or '_'")
            if len(text) > 8000:
                raise ValueError(f"prompt {name!r} is longer than 8000 characters")
        return value

    def as_options(self) -> dict[str, Any]:
        """Only what was set: unset switches leave the worker's defaults in force."""
        return self.model_dump(exclude_none=True)


PresetName = Annotated[str, Field(min_length=1, max_length=64, pattern=NAME_RE.pattern)]
ModelName = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9._:/@+-]+$")]


PromptPresets = Annotated[
    dict[PresetName, Prompts],
    Field(
        max_length=50,
        json_schema_extra={"propertyNames": {"minLength": 1, "maxLength": 64, "pattern": NAME_RE.pattern}},
    ),
]


class TurnChoice(TurnOptions):
    """A turn's options as a user sends them: the worker's, plus `prompt_preset`, one of the prompt presets an
    administrator allows (gateway/policy.py resolves it into `prompts` before the worker sees the turn)."""

    prompt_preset: PresetName | None = None


class TurnRequest(Body):
    message: str = Field(min_length=1, json_schema_extra={"pattern": NOT_BLANK})
    datasets: list[DatasetName] | None = Field(default=None, max_length=100)
    force_rag: bool = False
    options: TurnChoice | None = None

    _check_datasets = field_validator("datasets")(_dataset_names)

    @field_validator("message")
    @classmethod
    def _not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the message is empty")
        return value


def _index_name(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value:
        raise ValueError("the name is empty")
    if any(ord(ch) < 32 for ch in value):
        raise ValueError("the name contains control characters")
    return value


class IndexCreate(Body):
    name: str = Field(min_length=1, max_length=100, json_schema_extra={"pattern": PLAIN_NAME})
    description: str = Field(default="", max_length=2000)
    # Fixed when the index is made (the worker's table records them): the embedding model of its passages and
    # the language of its full-text index (docs/configuration.md, "Languages").
    embedder: Literal[EMBEDDERS] | None = None  # type: ignore[valid-type]
    language: Literal[INDEX_LANGUAGES] | None = None  # type: ignore[valid-type]

    _check_name = field_validator("name")(_index_name)


class IndexUpdate(Body):
    name: str | None = Field(
        default=None, min_length=1, max_length=100, json_schema_extra={"pattern": PLAIN_NAME}
    )
    description: str | None = Field(default=None, max_length=2000)

    _check_name = field_validator("name")(_index_name)


class BuildRequest(Body):
    rebuild: bool = False
    prune: bool = False  # also drop documents whose file is not in the index's uploads folder


class SettingsUpdate(Body):
    """What an administrator sets; a field left out keeps its stored value."""

    options: TurnOptions | None = None
    # Models a turn may name besides the worker's own GENERATION_MODEL and UTILITY_MODEL.
    allowed_models: list[ModelName] | None = Field(default=None, max_length=50)
    # Named sets of prompts ({name: {prompt: text}}) that every user may choose with `options.prompt_preset`.
    prompt_presets: PromptPresets | None = None

    @field_validator("prompt_presets")
    @classmethod
    def _presets(cls, value: dict[str, dict[str, str]] | None) -> dict[str, dict[str, str]] | None:
        for name, prompts in (value or {}).items():
            if not NAME_RE.fullmatch(name):
                raise ValueError(f"preset name {name[:80]!r} must be 1 to 64 letters, digits, '_' or '-'")
            try:
                TurnOptions.model_validate({"prompts": prompts})  # the same rules as a turn's prompts
            except ValidationError as exc:
                raise ValueError(f"preset {name!r}: {exc.errors()[0]['msg']}") from None
        return value


class StopRequest(Body):
    """`POST /api/chats/{id}/stop` takes no fields; an empty body or `{}` is fine."""
