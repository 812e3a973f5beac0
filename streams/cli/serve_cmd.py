"""``costline serve``: the read-only API and the dashboard without a worker.

The same routes as a worker's web port (``costline.streams.api.routes``), answered from the
same Redis (and the dead-letter topic in Kafka), for a reader that should not run the stream
processors: a dashboard host, a laptop pointed at production's Redis. Nothing it serves
changes anything.
"""

from __future__ import annotations

import typer

from costline.streams.cli import command_group


@command_group
def register(app: typer.Typer) -> None:
    @app.command()
    def serve(
        ctx: typer.Context,
        host: str = typer.Option("0.0.0.0", help="Address to listen on."),
        port: int | None = typer.Option(None, min=1, max=65535, help="Port; default "
                                        "COSTLINE_WEB_PORT."),
    ) -> None:
        """Serve the read-only HTTP API (/api/v1/...) and the dashboard (/) until stopped."""
        import logging

        from aiohttp import web

        from costline.connectors.redis_client import connect, connect_async
        from costline.rules.prices import PriceBook
        from costline.streams.api.answers import OpenData
        from costline.streams.api.routes import application
        from costline.streams.cli.root import settings_of
        from costline.streams.worker.evaluator import RuleSource
        from costline.streams.worker.health import Health

        settings = settings_of(ctx)
        port = port or settings.web_port
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        source = RuleSource(settings.rules, settings.timezone, PriceBook.load(settings.prices),
                            Health())
        token = settings.api_token.get_secret_value() if settings.api_token else None
        redis = connect(settings.redis_url, timeout_s=30)

        async def healthz(request: web.Request) -> web.Response:
            return web.json_response({"status": "ok"})

        async def close(app: web.Application) -> None:
            await app["async_redis"].aclose()

        async def made() -> web.Application:
            async_redis = connect_async(settings.redis_url, timeout_s=30)
            data = OpenData(settings, redis, async_redis, source.rules)
            served = application(data, token,
                                 lambda app: app.router.add_get("/healthz", healthz))
            served["async_redis"] = async_redis
            served.on_cleanup.append(close)
            return served

        typer.echo(f"costline serve: the dashboard at http://{host}:{port}/, the API at "
                   f"/api/v1/ (OpenAPI: /api/v1/openapi.json)"
                   f"{'; a bearer token is required' if token else ''}", err=True)
        web.run_app(made(), host=host, port=port, print=None, access_log=None)
