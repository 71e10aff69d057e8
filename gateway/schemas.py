"""Request bodies, validated once at the door into typed objects (a bad one is a 400 naming the field)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from contract.languages import EMBEDDERS, INDEX_LANGUAGES, LANGUAGE_TAG_PATTERN, language_hint

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


def _boolean(schema: dict) -> None:
    """A field the model takes as null too (= left out), documented as what to send: a boolean."""
    schema.pop("anyOf", None)
    schema["type"] = "boolean"


class UserUpdate(Body):
    """An administrator's change to an account; a field left out is left as it is (at least one is needed)."""

    model_config = ConfigDict(
        json_schema_extra={"anyOf": [{"required": ["disabled"]}, {"required": ["is_admin"]}]}
    )

    disabled: bool | None = Field(default=None, json_schema_extra=_boolean)
    is_admin: bool | None = Field(default=None, json_schema_extra=_boolean)

    @field_validator("disabled", "is_admin", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # The schema says boolean: a null is not "leave it as it is" (that is leaving the field out).
        if value is None:
            raise ValueError("must be true or false; leave the field out to keep it as it is")
        return value


class PasswordReset(Body):
    """An administrator sets a new password for an account (every session of it ends)."""

    new_password: str = Field(min_length=8, max_length=1024)


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
    # The interface's language (the web sends its locale with each turn): the answer's language only when the
    # message is too short or unsure to detect (the worker's rag_worker/i18n.choose).
    language: str | None = Field(
        default=None,
        max_length=35,
        pattern=LANGUAGE_TAG_PATTERN,
        description="the interface's language (fr, fr-CA): used only when the message's language is too short "
        "or unsure to detect; a surely detected language wins",
    )

    @field_validator("language", mode="before")
    @classmethod
    def _language(cls, value: str | None) -> str | None:
        return None if value is None else language_hint(value)

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


# A group's name: letters, digits, spaces and `_ . -`, not blank (a share dialog shows it as typed).
GROUP_NAME_RE = re.compile(r"^[A-Za-z0-9_.\- ]{1,64}$")


def _group_name(value: str | None) -> str | None:
    if value is None:
        return None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("the name contains control characters")
    value = " ".join(value.split())
    if not value:
        raise ValueError("the name is empty")
    if not GROUP_NAME_RE.fullmatch(value):
        raise ValueError("a group name is 1 to 64 letters, digits, spaces, '_', '.' or '-'")
    return value


class GroupCreate(Body):
    name: str = Field(min_length=1, max_length=64, json_schema_extra={"pattern": GROUP_NAME_RE.pattern})
    description: str = Field(default="", max_length=2000)

    _check_name = field_validator("name")(_group_name)


class GroupUpdate(Body):
    name: str | None = Field(
        default=None, min_length=1, max_length=64, json_schema_extra={"pattern": GROUP_NAME_RE.pattern}
    )
    description: str | None = Field(default=None, max_length=2000)

    _check_name = field_validator("name")(_group_name)


# Optional ids and names of a share or a membership: left out when not given, never `null` (the schema's
# oneOf says which one a body names, so a null would make a body valid in one reading and not in the other).
def _no_default(schema: dict) -> None:
    schema.pop("default", None)


OptionalId = Annotated[
    int | None,
    WithJsonSchema({"type": "integer", "minimum": 1, "maximum": MAX_ID}),
    Field(ge=1, le=MAX_ID, json_schema_extra=_no_default),
]
OptionalName = Annotated[
    str | None,
    WithJsonSchema({"type": "string", "minLength": 1, "maxLength": 64}),
    Field(min_length=1, max_length=64, json_schema_extra=_no_default),
]
SUBJECT_FIELDS = ("user_id", "username", "group_id")


def _no_nulls(data: Any) -> Any:
    if isinstance(data, dict):
        for name in SUBJECT_FIELDS:
            if name in data and data[name] is None:
                raise ValueError(f"{name} must not be null: leave it out")
    return data


# Exactly one of `user_id` and `username` (the routes check it too, with a 400 that says so).
ONE_USER = {"oneOf": [{"required": ["user_id"]}, {"required": ["username"]}]}


class MemberAdd(Body):
    """A user to add: by id or by username (exactly one)."""

    model_config = ConfigDict(json_schema_extra=ONE_USER)

    user_id: OptionalId = None
    username: OptionalName = None

    _no_nulls = model_validator(mode="before")(_no_nulls)


def _grant_schema(schema: dict) -> None:
    """The subjects a grant names, for the OpenAPI document: a user by id or name, a group by id, or everyone."""
    none_of = lambda *names: [{"not": {"required": [n]}} for n in names]  # noqa: E731
    schema["oneOf"] = [
        {
            "properties": {"subject_type": {"const": "user"}},
            "required": ["user_id"],
            "allOf": none_of("username", "group_id"),
        },
        {
            "properties": {"subject_type": {"const": "user"}},
            "required": ["username"],
            "allOf": none_of("user_id", "group_id"),
        },
        {
            "properties": {"subject_type": {"const": "group"}},
            "required": ["group_id"],
            "allOf": none_of("user_id", "username"),
        },
        {
            "properties": {"subject_type": {"const": "everyone"}},
            "allOf": none_of("user_id", "username", "group_id"),
        },
    ]


class GrantCreate(Body):
    """Share an index: with a user (`user_id` or `username`), a group (`group_id`) or everyone signed in."""

    model_config = ConfigDict(json_schema_extra=_grant_schema)

    subject_type: Literal["user", "group", "everyone"]
    user_id: OptionalId = None
    username: OptionalName = None

    _no_nulls = model_validator(mode="before")(_no_nulls)
    group_id: OptionalId = None
    role: Literal["reader", "editor"]


class GrantUpdate(Body):
    role: Literal["reader", "editor"]


class OwnerTransfer(Body):
    """The new owner (by id or username); the previous owner keeps `previous_owner_role` access (null: none)."""

    model_config = ConfigDict(json_schema_extra=ONE_USER)

    user_id: OptionalId = None
    username: OptionalName = None

    _no_nulls = model_validator(mode="before")(_no_nulls)
    previous_owner_role: Literal["reader", "editor"] | None = "editor"
