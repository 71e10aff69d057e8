"""What an administrator allows users to choose for their turns (gateway/policy.py), in-process with no worker:
prompt overrides are admins' only, presets are everyone's, models outside the allowed list are refused; the
admin settings that hold both lists."""

from __future__ import annotations

from starlette.testclient import TestClient

from tests.unit.test_gateway_security import app_client, bearer, register


def setup(c: TestClient) -> tuple[dict, dict, str]:
    admin, member = register(c, "admin"), register(c, "member")
    chat = c.post("/api/chats", json={}, headers=bearer(member)).json()
    return admin, member, f"/api/chats/{chat['id']}/messages"


def turn(c: TestClient, url: str, user: dict, **options):
    return c.post(url, json={"message": "hello there", "options": options}, headers=bearer(user))


def test_a_member_may_not_override_prompts_but_may_choose_a_preset(tmp_path) -> None:
    with app_client(tmp_path) as c:
        admin, member, url = setup(c)
        r = turn(c, url, member, prompts={"system": "Ignore the sources."})
        assert (r.status_code, r.json()["code"], r.json()["field"]) == (
            403,
            "prompts_admin_only",
            "options.prompts",
        )
        assert "administrator" in r.json()["error"]
        r = turn(c, url, member, prompt_preset="terse")
        assert (r.status_code, r.json()["code"]) == (409, "unknown_preset")

        presets = {"terse": {"system": "Answer in one sentence."}}
        r = c.put("/api/settings", json={"prompt_presets": presets}, headers=bearer(member))
        assert r.status_code == 403
        r = c.put("/api/settings", json={"prompt_presets": presets}, headers=bearer(admin))
        assert r.status_code == 200, r.text
        assert r.json()["prompt_presets"] == presets and r.json()["presets"] == ["terse"]
        # The member sees the names, not the prompts; the admin sees both.
        mine = c.get("/api/settings", headers=bearer(member)).json()
        assert (mine["presets"], mine["prompt_presets"]) == (["terse"], None)
        assert c.get("/api/settings", headers=bearer(admin)).json()["prompt_presets"] == presets

        # Allowed now: the turn goes on to the worker (none runs here: 503).
        assert turn(c, url, member, prompt_preset="terse").status_code == 503
        r = turn(c, url, member, prompt_preset="chatty")
        assert (r.status_code, r.json()["code"]) == (409, "unknown_preset")
        assert "terse" in r.json()["error"]
        admin_chat = c.post("/api/chats", json={}, headers=bearer(admin)).json()
        r = turn(c, f"/api/chats/{admin_chat['id']}/messages", admin, prompts={"system": "Be brief."})
        assert r.status_code == 503  # an admin may still override


def test_a_model_outside_the_allowed_list_is_refused_naming_the_allowed_ones(tmp_path) -> None:
    with app_client(tmp_path) as c:
        admin, member, url = setup(c)
        r = c.put(
            "/api/settings", json={"allowed_models": ["llama3.2:1b", "qwen3:4b"]}, headers=bearer(admin)
        )
        assert r.status_code == 200 and r.json()["allowed_models"] == ["llama3.2:1b", "qwen3:4b"]
        assert (
            turn(c, url, member, model="llama3.2:1b").status_code == 503
        )  # allowed: on to the (absent) worker
        # The turn defaults (other settings) are kept when only the list changes, and the reverse.
        c.put("/api/settings", json={"options": {"top_k": 3}}, headers=bearer(admin))
        got = c.get("/api/settings", headers=bearer(member)).json()
        assert got["options"] == {"top_k": 3} and got["allowed_models"] == ["llama3.2:1b", "qwen3:4b"]
        for bad in (["has space"], [""], "qwen3:4b"):
            r = c.put("/api/settings", json={"allowed_models": bad}, headers=bearer(admin))
            assert (r.status_code, r.json()["field"].split(".")[0]) == (400, "allowed_models"), bad
        r = c.put("/api/settings", json={"prompt_presets": {"x": {"../system": "y"}}}, headers=bearer(admin))
        assert (r.status_code, r.json()["field"]) == (400, "prompt_presets")
