"""What a user may choose for a turn, as an administrator allows it: the model, and the prompts.

**Models.** A turn may name the worker's own models (its GENERATION_MODEL and UTILITY_MODEL, read from its
/config), the turn defaults' model, and those an administrator lists in `allowed_models`; any other model is a
409 naming the allowed ones (well-formed, but not what this server offers: a conflict with its settings), for
every user (an administrator adds a model to the list first). Without this any user could load any model the
Ollama server has.

**Prompts.** A prompt override (`options.prompts`) reaches the model as its instructions, and the SQL prompt
decides which queries run over a user's tables: only administrators send them (a member's is a 403). Everyone
may choose one of the administrator's `prompt_presets` by name (`options.prompt_preset`), which the gateway
turns into `prompts` before the worker sees the turn.

Both lists live in the gateway's settings table (POLICY_KEY), set through `PUT /api/settings`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlmodel import Session

from .context import Context, in_thread
from .db import SettingRow, User, utcnow
from .errors import Conflict, Forbidden
from .quotas import check_options
from .schemas import TurnChoice, TurnRequest
from .turns.plan import default_options

POLICY_KEY = "turn_policy"


@dataclass
class Policy:
    allowed_models: list[str] = field(default_factory=list)
    prompt_presets: dict[str, dict[str, str]] = field(default_factory=dict)

    def data(self) -> dict[str, Any]:
        return {"allowed_models": list(self.allowed_models), "prompt_presets": dict(self.prompt_presets)}


def load_policy(s: Session) -> Policy:
    row = s.get(SettingRow, POLICY_KEY)
    value = dict(row.value) if row else {}
    return Policy(
        allowed_models=list(value.get("allowed_models") or []),
        prompt_presets=dict(value.get("prompt_presets") or {}),
    )


def store_policy(s: Session, policy: Policy) -> None:
    """Stage the policy in the session (the caller commits)."""
    row = s.get(SettingRow, POLICY_KEY) or SettingRow(key=POLICY_KEY)
    row.value = policy.data()
    row.updated_at = utcnow()
    s.add(row)


def configured_models(config: dict | None) -> list[str]:
    """The models a worker's /config says it is configured with."""
    settings = (config or {}).get("settings") or {}
    names = (settings.get("generation_model"), settings.get("utility_model"))
    return [name for name in names if isinstance(name, str) and name]


def choosable_models(policy: Policy, defaults: dict, configured: list[str]) -> list[str]:
    default = defaults.get("model")
    return list(dict.fromkeys([*configured, *([default] if default else []), *policy.allowed_models]))


async def allowed_turn(c: Context, user: User, body: TurnRequest) -> TurnRequest:
    """The turn as the worker may see it: its options within this server's limits, its model one the server
    allows, its prompt preset resolved into prompts; a 4xx that says what is not allowed (400 over a limit,
    403 a member's prompt override, 409 a model or preset this server does not offer)."""
    options = body.options
    check_options(options, c.settings)
    if options is None or (
        options.model is None and options.prompts is None and options.prompt_preset is None
    ):
        return body

    def load() -> tuple[Policy, dict]:
        with c.db.read() as s:
            return load_policy(s), default_options(s)

    policy, defaults = await in_thread(load)
    if options.model is not None:
        await check_model(c, options.model, policy, defaults)
    if options.prompts is not None and not user.is_admin:
        names = ", ".join(sorted(policy.prompt_presets)) or "none yet"
        raise Forbidden(
            "only an administrator may override prompts: choose one of the prompt presets with "
            f"options.prompt_preset (on this server: {names})",
            code="prompts_admin_only",
            field="options.prompts",
        )
    return body.model_copy(update={"options": with_preset(options, policy, defaults)})


async def check_model(c: Context, model: str, policy: Policy, defaults: dict) -> None:
    if model in choosable_models(policy, defaults, []):
        return  # allowed without asking the worker
    allowed = choosable_models(policy, defaults, configured_models(await c.worker.config()))
    if model not in allowed:
        raise Conflict(
            f"the model {model[:200]!r} is not offered on this server; the models are: {', '.join(allowed)}",
            code="model_not_allowed",
            field="options.model",
        )


def with_preset(options: TurnChoice, policy: Policy, defaults: dict) -> TurnChoice:
    """`prompt_preset` resolved into `prompts`: the defaults' prompts, then the preset's, then (an admin's) own."""
    name = options.prompt_preset
    if name is None:
        return options
    preset = policy.prompt_presets.get(name)
    if preset is None:
        names = ", ".join(sorted(policy.prompt_presets)) or "none"
        raise Conflict(
            f"there is no prompt preset {name!r} on this server; the presets are: {names}",
            code="unknown_preset",
            field="options.prompt_preset",
        )
    prompts = {**(defaults.get("prompts") or {}), **preset, **(options.prompts or {})}
    return options.model_copy(update={"prompt_preset": None, "prompts": prompts})
