"""Gateway settings, read once from the environment (or passed in by tests and tools)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_GATEWAY_WORKERS = 64


def cpu_count() -> int:
    """The CPUs this process may run on (a container's cpuset included)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def default_workers() -> int:
    return min(cpu_count(), MAX_GATEWAY_WORKERS)


def private_dir(path: Path) -> Path:
    """A data folder only this account can read (0700), made if missing; one that exists is left as it is
    (an operator may share it on purpose)."""
    if not path.exists():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)  # mkdir's mode is filtered by the umask
    return path


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_file=None, extra="ignore", populate_by_name=True)

    index_store: Path = Field(default=Path("./index_store"), alias="INDEX_STORE")
    # Empty means SQLite in INDEX_STORE/gateway.db; production sets postgresql+psycopg://...
    database_url: str = Field(default="", alias="DATABASE_URL")

    worker_url: str = Field(default="http://127.0.0.1:8001", alias="WORKER_URL")
    worker_api_key: SecretStr | None = Field(default=None, alias="WORKER_API_KEY")
    # The worker sends a keepalive at least every 15 s, so a longer silence means it is stuck.
    worker_read_timeout_s: float = Field(default=120.0, alias="WORKER_READ_TIMEOUT_S")
    # Indexing an upload runs the embedder; on a small CPU that takes minutes.
    worker_upload_timeout_s: float = Field(default=900.0, alias="WORKER_UPLOAD_TIMEOUT_S")
    worker_max_connections: int = Field(default=500, alias="WORKER_MAX_CONNECTIONS")
    # Threads that run the turns' database work at once, per process (the turn lane, gateway/context.py;
    # 0: 1 on SQLite, which takes one writer at a time anyway, 4 on Postgres).
    turn_db_threads: int = Field(default=0, alias="TURN_DB_THREADS", ge=0, le=64)
    # When set, /health asks Ollama directly (a fresh answer); unset, it reports the worker's view of its LLM.
    ollama_host: str | None = Field(default=None, alias="OLLAMA_HOST")
    title_timeout_s: float = Field(default=30.0, alias="TITLE_TIMEOUT_S")

    jwt_secret: SecretStr | None = Field(default=None, alias="JWT_SECRET")
    jwt_ttl_s: int = Field(default=24 * 3600, alias="JWT_TTL", gt=0)
    allow_registration: bool = Field(default=True, alias="ALLOW_REGISTRATION")

    uploads_dir: Path = Field(default=Path("./shared_uploads"), alias="UPLOADS_DIR")
    max_upload_bytes: int = Field(default=50 * 1024 * 1024, alias="MAX_UPLOAD_BYTES", gt=0)
    max_json_bytes: int = Field(default=1024 * 1024, alias="MAX_JSON_BYTES", gt=0)

    # Failed logins: the first few are free, then each answer is delayed (doubling), then refused for a while.
    login_free_attempts: int = Field(default=5, alias="LOGIN_FREE_ATTEMPTS")
    login_base_delay_s: float = Field(default=0.5, alias="LOGIN_BASE_DELAY_S")
    login_max_delay_s: float = Field(default=5.0, alias="LOGIN_MAX_DELAY_S")
    login_lock_attempts: int = Field(default=20, alias="LOGIN_LOCK_ATTEMPTS")
    login_window_s: float = Field(default=900.0, alias="LOGIN_WINDOW_S")
    # Failed logins per client address, whatever the account: a higher bar (several people may share one).
    login_address_lock_attempts: int = Field(default=100, alias="LOGIN_ADDRESS_LOCK_ATTEMPTS")
    # New accounts per client address inside the window.
    register_limit: int = Field(default=10, alias="REGISTER_LIMIT", ge=1)
    register_window_s: float = Field(default=3600.0, alias="REGISTER_WINDOW_S", gt=0)
    # Proxies whose X-Forwarded-For / X-Forwarded-Proto are believed: addresses, networks, or `*`.
    forwarded_allow_ips: str = Field(default="127.0.0.1", alias="FORWARDED_ALLOW_IPS")
    # Origins besides the gateway's own that may send state-changing requests with the session cookie
    # (comma-separated, e.g. `https://chat.example.org` when a proxy rewrites the Host header).
    allowed_origins: str = Field(default="", alias="GATEWAY_ALLOWED_ORIGINS")
    # Host names the gateway answers to besides loopback names and IP addresses: the names it is published as
    # (comma-separated, `.example.org` for a domain and its subdomains; `*`: any). Another is 421 (DNS rebinding).
    allowed_hosts: str = Field(default="", alias="GATEWAY_ALLOWED_HOSTS")
    # Turns one account may have running at once (across its chats), and the longest answer it may ask for.
    max_turns_per_user: int = Field(default=4, alias="MAX_TURNS_PER_USER", ge=1)
    # Uploads one account may have being indexed at once (the web sends two at a time).
    max_uploads_per_user: int = Field(default=4, alias="MAX_UPLOADS_PER_USER", ge=1)
    max_tokens: int = Field(default=2048, alias="MAX_TOKENS", ge=1, le=8192)
    # API keys (gateway/keys.py): requests one key may make inside the window (counted in the database, shared by
    # every process and replica: gateway/ratelimits.py), and the keys one account may hold at once.
    api_key_rate_limit: int = Field(default=120, alias="API_KEY_RATE_LIMIT", ge=1)
    api_key_rate_window_s: float = Field(default=60.0, alias="API_KEY_RATE_WINDOW_S", gt=0)
    max_api_keys_per_user: int = Field(default=50, alias="MAX_API_KEYS_PER_USER", ge=1)

    # What the gateway sends as history: the worker refuses more than this (WORKER_API.md limits).
    max_history_messages: int = Field(default=200, alias="MAX_HISTORY_MESSAGES")
    max_history_chars: int = Field(default=200_000, alias="MAX_HISTORY_CHARS")
    max_message_chars: int = Field(default=8000, alias="MAX_MESSAGE_CHARS")
    # A running turn's owner refreshes its heartbeat every TURN_HEARTBEAT_S (and saves the answer so far then,
    # or every TURN_SAVE_TOKENS tokens); a heartbeat older than TURN_LOCK_STALE_S means the owner crashed: the
    # turn is marked interrupted and the chat takes new messages again.
    turn_lock_stale_s: float = Field(default=15.0, alias="TURN_LOCK_STALE_S", gt=0)
    turn_heartbeat_s: float = Field(default=1.0, alias="TURN_HEARTBEAT_S", gt=0)
    turn_save_tokens: int = Field(default=50, alias="TURN_SAVE_TOKENS", gt=0)
    keepalive_s: float = Field(default=15.0, alias="SSE_KEEPALIVE_S")
    # Background jobs (gateway/jobs/): an upload is stored in JOBS_DIR (empty: INDEX_STORE/jobs; files 0600)
    # until its job ends. At most JOB_PARALLEL jobs run at once in one replica, of different indexes (one index
    # runs one job at a time); a file whose try broke (the worker died, its stream broke) is tried at most
    # JOB_FILE_RETRIES times in all. The owner refreshes its heartbeat every JOB_HEARTBEAT_S; one older than
    # JOB_STALE_S means it died, and any replica takes the job over. Finished jobs are kept JOB_RETENTION_DAYS.
    jobs_dir: Path | None = Field(default=None, alias="JOBS_DIR")
    job_parallel: int = Field(default=2, alias="JOB_PARALLEL", ge=1, le=64)
    job_file_retries: int = Field(default=3, alias="JOB_FILE_RETRIES", ge=1, le=20)
    job_heartbeat_s: float = Field(default=1.0, alias="JOB_HEARTBEAT_S", gt=0, le=60)
    job_stale_s: float = Field(default=15.0, alias="JOB_STALE_S", gt=0)
    job_retention_days: float = Field(default=30.0, alias="JOB_RETENTION_DAYS", gt=0)

    # Index sources (gateway/sync/): a folder source must lie inside one of SYNC_ROOTS (absolute folders, `:`-
    # separated, symlinks followed; empty: no folder source is accepted). An S3 source names no endpoint (AWS)
    # or one of SYNC_S3_ENDPOINTS (comma-separated URLs: a MinIO, a Ceph gateway); the gateway connects nowhere
    # else. Each replica looks for sources whose schedule is due every SYNC_POLL_S seconds.
    sync_roots: str = Field(default="", alias="SYNC_ROOTS")
    sync_s3_endpoints: str = Field(default="", alias="SYNC_S3_ENDPOINTS")
    sync_poll_s: float = Field(default=30.0, alias="SYNC_POLL_S", gt=0, le=3600)

    web_dir: Path = Field(default=REPO_ROOT / "web", alias="WEB_DIR")
    # uvicorn processes `python -m gateway serve` starts on its one port (1 to 64; default: the CPUs it may use).
    # They share everything a turn, a limit or a job needs through the database (docs/design/ARCHITECTURE.md).
    gateway_workers: int = Field(
        default_factory=default_workers, alias="GATEWAY_WORKERS", ge=1, le=MAX_GATEWAY_WORKERS
    )

    def resolved_turn_db_threads(self) -> int:
        """TURN_DB_THREADS, or its default for the database in use."""
        if self.turn_db_threads:
            return self.turn_db_threads
        return 1 if self.resolved_database_url().startswith("sqlite") else 4

    @field_validator("worker_api_key", mode="before")
    @classmethod
    def _empty_key_is_no_key(cls, value):
        # docker compose passes WORKER_API_KEY="" when none is set: that means no key, as on the worker.
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        return value

    @field_validator("gateway_workers", mode="before")
    @classmethod
    def _empty_workers_is_the_default(cls, value):
        # docker compose passes GATEWAY_WORKERS="" when none is set: that means one process per CPU.
        if isinstance(value, str) and not value.strip():
            return default_workers()
        return value

    @field_validator("sync_roots")
    @classmethod
    def _roots_are_absolute(cls, value: str) -> str:
        from contract.sync import parse_roots

        parse_roots(value)  # ValueError names the entry that is not an absolute path
        return value

    @field_validator("sync_s3_endpoints")
    @classmethod
    def _endpoints_are_urls(cls, value: str) -> str:
        for item in value.split(","):
            item = item.strip()
            if item and not item.startswith(("http://", "https://")):
                raise ValueError(f"SYNC_S3_ENDPOINTS: {item!r} is not an http(s) URL")
        return value

    def resolved_sync_roots(self):
        from contract.sync import parse_roots

        return parse_roots(self.sync_roots)

    def s3_endpoints(self) -> set[str]:
        return {e.strip().rstrip("/") for e in self.sync_s3_endpoints.split(",") if e.strip()}

    @model_validator(mode="after")
    def _job_stale_after_heartbeats(self):
        if self.job_stale_s < 2 * self.job_heartbeat_s:
            raise ValueError(
                "JOB_STALE_S must be at least twice JOB_HEARTBEAT_S: a live job's owner would look dead"
            )
        return self

    def origins(self) -> set[str]:
        return {o.strip().rstrip("/").lower() for o in self.allowed_origins.split(",") if o.strip()}

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.index_store / 'gateway.db').resolve()}"

    def resolved_jobs_dir(self) -> Path:
        return (self.jobs_dir or self.index_store / "jobs").resolve()

    def resolved_jwt_secret(self) -> str:
        """JWT_SECRET, or one created once in the data folder and reused, so restarts keep sessions valid."""
        if self.jwt_secret is not None and self.jwt_secret.get_secret_value():
            return self.jwt_secret.get_secret_value()
        path = self.index_store / "gateway_jwt_secret"
        private_dir(path.parent)
        try:
            # O_EXCL: when several gateway processes start at once, exactly one writes the secret.
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            # Another process may have created it a moment ago and not written it yet.
            for _ in range(50):
                secret = path.read_text().strip()
                if secret:
                    return secret
                time.sleep(0.02)
            raise RuntimeError(f"{path} is empty: delete it or set JWT_SECRET") from None
        secret = secrets.token_urlsafe(48)
        with os.fdopen(fd, "w") as fh:
            fh.write(secret)
        return secret
