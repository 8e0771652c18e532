"""The ``sandbox-workspace`` command: one entry point, a subcommand per process.

sandbox-workspace dev       API + local backend on 127.0.0.1, no auth, for one machine
sandbox-workspace api       the API (backend and auth from SANDBOX_WORKSPACE_* settings)
sandbox-workspace runtime   the in-sandbox runtime (SANDBOX_RUNTIME_* settings)
sandbox-workspace operator  the Kubernetes operator (SANDBOX_OPERATOR_* settings)
sandbox-workspace egress-proxy  the egress proxy of a cluster's sandboxes
sandbox-workspace egress-ca     create the egress CA Secret once (the chart's hook Job)
sandbox-workspace crds      render the CustomResourceDefinitions from the models
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from . import __version__, logs, startup
from .server import serve


def _settings_error(e: ValidationError | SettingsError, prefix: str) -> int:
    if isinstance(e, SettingsError):  # a value that is not the JSON its type needs
        print(startup.settings_source_error(e, prefix, os.environ), file=sys.stderr)
        return 2
    for err in e.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        print(f"sandbox-workspace: invalid setting {loc}: {err['msg']}", file=sys.stderr)
    return 2


def _serve(app, host: str, port: int, **kwargs) -> int:
    """``serve``, with one line instead of a traceback when the address cannot be had."""
    try:
        serve(app, host, port, **kwargs)
    except OSError as e:
        message = startup.listen_error(e, host, port)
        if message is None:
            raise
        print(message, file=sys.stderr, flush=True)
        return 2
    return 0


def _cmd_runtime(args: argparse.Namespace) -> int:
    from .runtime.app import create_app
    from .runtime.confinement import harden_runtime_process
    from .runtime.settings import RuntimeSettings

    overrides = {
        k: v
        for k, v in {
            "host": args.host,
            "port": args.port,
            "root": args.root,
            "workspace_path": args.workspace_path,
        }.items()
        if v is not None
    }
    try:
        settings = RuntimeSettings(**overrides)
        app = create_app(settings)
    except (ValidationError, SettingsError) as e:
        return _settings_error(e, "SANDBOX_RUNTIME_")
    except ValueError as e:
        print(f"sandbox-workspace runtime: {e}", file=sys.stderr)
        return 2
    logs.configure(args.log_level)
    # The token must not reach executed code: not through inherited environment, not
    # through /proc/<runtime>/environ (unreadable once the process is not dumpable).
    os.environ.pop("SANDBOX_RUNTIME_TOKEN", None)
    os.environ.pop("SANDBOX_RUNTIME_CLAIM_KEY", None)  # a pooled runtime's (runtime/claim.py)
    harden_runtime_process()
    logging.getLogger("sandbox_workspace.runtime").info(
        "runtime ready", extra={"confinement": app.state.runtime.executor.confinement.describe()}
    )
    return _serve(
        app,
        settings.host,
        settings.port,
        port_file=args.port_file,
        log_level=args.log_level,
        uds=args.uds,
    )


def _cmd_api(args: argparse.Namespace, *, dev: bool = False) -> int:
    from .api.app import create_app
    from .api.routes import web
    from .api.settings import ENV_PREFIX, ApiSettings
    from .tracing import TracingConfigError

    overrides: dict = {
        k: v for k, v in {"host": args.host, "port": args.port}.items() if v is not None
    }
    if dev:
        overrides.update(backend="local", auth_mode="dev", data_dir=args.data_dir or Path("./data"))
        overrides.setdefault("host", "127.0.0.1")
        if f"{ENV_PREFIX}DEMO_MODEL" not in os.environ:  # chat to try with no model service
            overrides["demo_model"] = True
        for line in startup.dev_notices(os.environ, ENV_PREFIX):
            print(line, file=sys.stderr, flush=True)
    try:
        settings = ApiSettings(**overrides)
    except (ValidationError, SettingsError) as e:
        return _settings_error(e, ENV_PREFIX)
    if settings.store == "s3":  # a missing bucket or bad credentials: refuse to start
        import asyncio

        from .store import S3Store, StoreConfigError

        async def check() -> None:
            store = S3Store(settings.s3)
            try:
                await store.check()
            finally:
                await store.aclose()  # before the loop closes: see S3Store.aclose

        try:
            asyncio.run(check())
        except StoreConfigError as e:
            print(f"sandbox-workspace: {e}", file=sys.stderr, flush=True)
            return 2
    # dev logs text for a terminal, unless LOG_FORMAT asks otherwise.
    explicit_format = os.environ.get(f"{ENV_PREFIX}LOG_FORMAT")
    logs.configure(settings.log_level, "text" if dev and not explicit_format else None)
    try:
        app = create_app(settings)
    except TracingConfigError as e:
        print(f"sandbox-workspace: {e}", file=sys.stderr)
        return 2

    def banner(port: int) -> None:  # once listening: the real port, also for --port 0
        base = startup.url(settings.host, port)
        print(startup.dev_banner(base, settings.data_dir, web.enabled(settings)), flush=True)

    return _serve(
        app,
        settings.host,
        settings.port,
        port_file=args.port_file,
        log_level=settings.log_level,
        access_log=dev,  # dev: a line per request, to see what a client sends
        on_listening=banner if dev else None,
    )


def _cmd_crds(args: argparse.Namespace) -> int:
    from .operator import crdgen

    rendered = crdgen.render_all()
    if args.check:
        stale = [
            name
            for name, text in rendered.items()
            if not (args.output_dir / name).exists() or (args.output_dir / name).read_text() != text
        ]
        for name in stale:
            print(f"sandbox-workspace crds: {args.output_dir / name} is stale", file=sys.stderr)
        return 1 if stale else 0
    for path in crdgen.write_all(args.output_dir):
        print(path)
    return 0


def _cmd_operator(args: argparse.Namespace) -> int:
    from .kube import CredentialsError
    from .operator.main import run
    from .operator.settings import OperatorSettings
    from .tracing import TracingConfigError

    overrides = {"namespaces": args.namespace} if args.namespace else {}
    if args.all_namespaces:
        overrides["namespaces"] = []
    try:
        settings = OperatorSettings(**overrides)
    except (ValidationError, SettingsError) as e:
        return _settings_error(e, "SANDBOX_OPERATOR_")
    logs.configure(settings.log_level, settings.log_format)
    try:
        run(settings)
    except (CredentialsError, TracingConfigError) as e:
        print(f"sandbox-workspace operator: {e}", file=sys.stderr)
        return 2
    return 0


async def _until_sigterm(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` until it ends or SIGTERM comes, which cancels it (its ``finally``
    blocks close the listeners). In its container the proxy is PID 1, for which a signal
    with no handler does nothing: without this, each rollout or scale-down of the proxy
    waited out the pod's grace period (30 s) and then killed it."""
    import asyncio

    task = asyncio.ensure_future(main)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _cmd_egress_proxy(args: argparse.Namespace) -> int:
    import asyncio

    from .egress.policy import PolicyError
    from .egress.service import serve_cluster
    from .kube import CredentialsError

    logs.configure(args.log_level)
    try:
        asyncio.run(
            _until_sigterm(
                serve_cluster(
                    args.namespace,
                    args.host,
                    args.port,
                    forbidden=args.forbidden or (),
                    interval=args.interval,
                    kubeconfig=args.kubeconfig,
                    port_file=args.port_file,
                    ca_dir=args.ca_dir,
                    upstream_ca=args.upstream_ca,
                    secret_ttl=args.secret_ttl,
                    hosts=json.loads(args.hosts) if args.hosts else None,
                    permit=args.permit or (),
                    publish_trust_to=args.publish_ca or (),
                    max_connections=args.max_connections_per_session,
                    idle_timeout=args.idle_timeout,
                )
            )
        )
    except (CredentialsError, PolicyError, ValueError) as e:
        print(f"sandbox-workspace egress-proxy: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        message = startup.listen_error(e, args.host, args.port)
        if message is None:
            raise
        print(message, file=sys.stderr, flush=True)
        return 2
    except KeyboardInterrupt:
        pass
    return 0


def _cmd_egress_ca(args: argparse.Namespace) -> int:
    import asyncio

    from .egress.ca_store import ensure_ca_secret, publish_trust
    from .kube import CredentialsError, Kube, KubeError, load_credentials

    targets = [tuple(t.split("/", 1)) for t in args.configmap]
    if any(len(t) != 2 or not all(t) for t in targets):
        print("sandbox-workspace egress-ca: --configmap NAMESPACE/NAME", file=sys.stderr)
        return 2

    async def run() -> None:
        kube = Kube(load_credentials(args.kubeconfig))
        try:
            cert_pem = await ensure_ca_secret(kube, args.namespace, args.secret)
            await publish_trust(kube, cert_pem, targets)
        finally:
            await kube.aclose()

    try:
        asyncio.run(run())
    except (CredentialsError, KubeError, RuntimeError, ValueError) as e:
        print(f"sandbox-workspace egress-ca: {e}", file=sys.stderr)
        return 1
    print(f"egress CA: Secret {args.namespace}/{args.secret}; published to {args.configmap}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sandbox-workspace",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", help="address to listen on")
        p.add_argument("--port", type=int, help="port to listen on (0 picks a free one)")
        p.add_argument("--port-file", type=Path, help="write the bound port to this file")

    dev = sub.add_parser("dev", help="run the API on the local backend (no cluster, no auth)")
    common(dev)
    dev.add_argument("--data-dir", type=Path, help="where workspaces live (default ./data)")
    dev.set_defaults(func=lambda a: _cmd_api(a, dev=True))

    api = sub.add_parser("api", help="run the API (settings from SANDBOX_WORKSPACE_*)")
    common(api)
    api.set_defaults(func=_cmd_api)

    runtime = sub.add_parser("runtime", help="run the in-sandbox runtime (SANDBOX_RUNTIME_*)")
    common(runtime)
    runtime.add_argument("--root", type=Path, help="workspace root (default /workspace)")
    runtime.add_argument("--workspace-path", help="the root as sandboxed code sees it")
    runtime.add_argument(
        "--uds", type=Path, help="listen on this Unix socket instead of --host/--port"
    )
    runtime.add_argument("--log-level", default=os.environ.get("SANDBOX_RUNTIME_LOG_LEVEL", "info"))
    runtime.set_defaults(func=_cmd_runtime)

    op = sub.add_parser("operator", help="run the Kubernetes operator (SANDBOX_OPERATOR_*)")
    scope = op.add_mutually_exclusive_group()
    scope.add_argument(
        "-n",
        "--namespace",
        action="append",
        help="namespace to watch (repeatable; default from SANDBOX_OPERATOR_NAMESPACES)",
    )
    scope.add_argument(
        "-A", "--all-namespaces", action="store_true", help="watch the whole cluster"
    )
    op.set_defaults(func=_cmd_operator)

    egress = sub.add_parser(
        "egress-proxy", help="run the egress proxy of the sandboxes in these namespaces"
    )
    egress.add_argument("--host", default="0.0.0.0", help="address to listen on")
    egress.add_argument("--port", type=int, default=3128, help="port (0 picks a free one)")
    egress.add_argument("--port-file", type=Path, help="write the bound port to this file")
    egress.add_argument(
        "-n", "--namespace", action="append", required=True, help="sessions' namespace"
    )
    egress.add_argument(
        "--forbidden",
        action="append",
        help="a CIDR never reached besides the defaults (pod, service, store ranges)",
    )
    egress.add_argument(
        "--interval", type=float, default=2.0, help="seconds between reads of the sessions"
    )
    egress.add_argument(
        "--ca-dir",
        type=Path,
        help="the intercept CA (tls.crt, tls.key: the mounted Secret); without it hosts "
        "with a secret bound are refused",
    )
    egress.add_argument(
        "--publish-ca",
        action="append",
        metavar="NAMESPACE/NAME",
        help="with --ca-dir: write the CA certificate and trust bundle (no key) to this "
        "ConfigMap at start, for sandbox pods to mount (repeatable)",
    )
    egress.add_argument("--upstream-ca", help="CA file the upstreams of bound hosts must chain to")
    egress.add_argument(
        "--secret-ttl",
        type=float,
        default=5.0,
        help="seconds a Kubernetes Secret's value is reused before it is read again",
    )
    egress.add_argument(
        "--max-connections-per-session",
        type=int,
        default=64,
        help="connections one session may have open at once; the next is answered 429",
    )
    egress.add_argument(
        "--idle-timeout",
        type=float,
        default=600.0,
        help="seconds a tunnel may move no byte before it is closed",
    )
    egress.add_argument("--hosts", help=argparse.SUPPRESS)  # tests: JSON name table
    egress.add_argument("--permit", action="append", help=argparse.SUPPRESS)  # tests only
    egress.add_argument("--kubeconfig", type=Path, help="default: as kubectl finds it")
    egress.add_argument("--log-level", default="info")
    egress.set_defaults(func=_cmd_egress_proxy)

    ca = sub.add_parser(
        "egress-ca",
        help="create the egress proxy's CA Secret once and publish its certificate",
    )
    ca.add_argument("--namespace", required=True, help="the CA Secret's namespace")
    ca.add_argument("--secret", required=True, help="the CA Secret's name (kept if present)")
    ca.add_argument(
        "--configmap",
        action="append",
        default=[],
        metavar="NAMESPACE/NAME",
        help="a ConfigMap to write the certificate and trust bundle to (repeatable)",
    )
    ca.add_argument("--kubeconfig", type=Path, help="default: as kubectl finds it")
    ca.set_defaults(func=_cmd_egress_ca)

    crds = sub.add_parser("crds", help="render crds/*.yaml from the CRD models")
    crds.add_argument("--output-dir", type=Path, default=Path("crds"), help="default ./crds")
    crds.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when the files are stale"
    )
    crds.set_defaults(func=_cmd_crds)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
