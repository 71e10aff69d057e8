"""The gateway's application factory: routes assembled from a plain list, nothing built at import time."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Mount

from contract.hosts import AllowedHosts

from . import (
    accounts,
    audit,
    chats,
    export,
    feedback,
    groups,
    keys_api,
    lifecycle,
    meta,
    metrics,
    openapi,
    sources,
    telemetry,
    v1,
)
from .auth import LoginThrottle
from .context import Context
from .db import Database
from .errors import HANDLERS
from .fallback import fallback_for
from .headers import SecurityHeaders
from .hosts import HostCheck
from .indexes import builds, sharing
from .indexes import routes as indexes
from .indexes import settings as index_settings
from .jobs import routes as jobs
from .limits import BodyLimit
from .proxy import ProxyHeaders
from .quotas import upload_slots
from .ratelimits import RateLimit
from .settings import Settings
from .sync import routes as sync_sources
from .turns import routes as turns
from .turns import steplog
from .web import WebFiles
from .worker_client import WorkerClient

log = logging.getLogger("gateway")

SHUTDOWN_GRACE_S = 30.0


def create_app(settings: Settings | None = None) -> Starlette:
    settings = settings or Settings()
    db = Database(settings.resolved_database_url())
    throttle = LoginThrottle(
        free=settings.login_free_attempts,
        base_delay_s=settings.login_base_delay_s,
        max_delay_s=settings.login_max_delay_s,
        lock_after=settings.login_lock_attempts,
        window_s=settings.login_window_s,
    )
    address_throttle = LoginThrottle(
        free=settings.login_lock_attempts,
        base_delay_s=settings.login_base_delay_s,
        max_delay_s=settings.login_max_delay_s,
        lock_after=settings.login_address_lock_attempts,
        window_s=settings.login_window_s,
    )
    registrations = RateLimit(limit=settings.register_limit, window_s=settings.register_window_s)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        version = await asyncio.to_thread(db.migrate)
        log.info("gateway database at schema version %d", version)
        worker = WorkerClient(settings)
        app.state.ctx = Context(
            settings=settings,
            db=db,
            worker=worker,
            jwt_secret=settings.resolved_jwt_secret(),
            throttle=throttle,
            address_throttle=address_throttle,
            registrations=registrations,
            upload_slots=upload_slots(settings.max_uploads_per_user),
            key_limits=RateLimit(limit=settings.api_key_rate_limit, window_s=settings.api_key_rate_window_s),
            turn_lane=anyio.CapacityLimiter(settings.resolved_turn_db_threads()),
        )
        # Turns left `running` by a gateway that died are marked interrupted now and whenever found later.
        sweeper = asyncio.create_task(
            lifecycle.sweep_forever(db, settings.turn_lock_stale_s), name="turn-sweeper"
        )
        # The /v1 turns this process relays keep their rows alive (MAX_TURNS_PER_USER on every process).
        from .turns.running import beat_v1_forever

        v1_beat = asyncio.create_task(beat_v1_forever(app.state.ctx), name="v1-turns")
        # Jobs: queued ones, and those left by a replica that died, are taken up now and whenever found later.
        app.state.ctx.jobs.start()
        # Sources with a schedule (gateway/sync/schedule.py): each replica polls; one claims each due run.
        from .sync.schedule import schedule_forever

        scheduler = asyncio.create_task(schedule_forever(app.state.ctx), name="sync-scheduler")
        # Indexes from before migration 12: their embedder and language, read from the worker's markers.
        backfill = asyncio.create_task(index_settings.backfill_forever(app.state.ctx), name="index-settings")
        try:
            yield
        finally:
            sweeper.cancel()
            scheduler.cancel()
            v1_beat.cancel()
            # Running jobs are handed back (queued again, their committed files kept) for the next replica.
            await app.state.ctx.jobs.stop()
            backfill.cancel()
            running = list(app.state.ctx.running)
            if running:
                # Let turns in flight finish and be stored; past the grace they are stored as interrupted.
                _done, pending = await asyncio.wait(running, timeout=SHUTDOWN_GRACE_S)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            await worker.aclose()
            db.dispose()
            telemetry.shutdown_tracing()
            metrics.process_ended()

    api_routes = [
        *accounts.routes,
        *keys_api.routes,
        *chats.routes,
        *turns.routes,
        *builds.routes,  # before indexes: the build routes live there
        *indexes.routes,
        *sync_sources.routes,
        *sharing.routes,
        *groups.routes,
        *audit.routes,
        *sources.routes,
        *feedback.routes,
        *export.routes,
        *meta.routes,
        *openapi.routes,
        *v1.routes,
        *metrics.routes,
        *steplog.routes,
        *jobs.routes,
    ]
    routes = [
        *api_routes,
        fallback_for(api_routes),  # any other /api request: JSON 405 or 404, never the web files
        v1.fallback,  # any other /v1 request: the same in OpenAI's shape
        # Last, so /api and /health win; the whole web/ folder (with node_modules) is served.
        Mount("/", app=WebFiles(settings.web_dir), name="web"),
    ]
    # Multipart framing adds a little to the file: allow for it; the file itself is then checked exactly.
    upload_limit = settings.max_upload_bytes + 64 * 1024
    middleware = [
        # A span per request when OTLP export is configured (nothing otherwise); then the request id, the HTTP
        # metrics and the access line, so that refusals below are counted and logged too.
        *telemetry.tracing_middleware(),
        Middleware(telemetry.RequestObserver),
        # First: the client address every limit below counts by.
        Middleware(ProxyHeaders, trusted=settings.forwarded_allow_ips),
        Middleware(SecurityHeaders),
        Middleware(HostCheck, allowed=AllowedHosts.parse(settings.allowed_hosts)),
        Middleware(BodyLimit, default=settings.max_json_bytes, larger=[(indexes.UPLOAD_PATH, upload_limit)]),
        # Last: it sees the route the router matched, for the metrics' route label.
        Middleware(telemetry.RouteNote),
    ]
    return Starlette(routes=routes, middleware=middleware, exception_handlers=HANDLERS, lifespan=lifespan)
