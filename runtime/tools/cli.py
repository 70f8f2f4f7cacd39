"""The ``raytxn`` command line (typer + rich).

Every read command takes ``--json`` for scripts; errors print one line and exit with 1 (a raytxn
error) or 2 (bad usage). Commands other than ``start``/``bench``/``chaos``/``sim`` attach to the running
cluster (``--address``, default ``auto``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from raytxn.errors import MissingExtra, RaytxnError
from raytxn.extras import require_extra
from raytxn.protocol.compaction import DEFAULT_DELETE_RETENTION_MS
from raytxn.tools import bench, local_ray

app = typer.Typer(help="raytxn: exactly-once transactional messaging on Ray.", no_args_is_help=True)
topics_app = typer.Typer(help="Create, list, inspect and delete topics.", no_args_is_help=True)
subs_app = typer.Typer(help="List, inspect and reset subscriptions.", no_args_is_help=True)
txns_app = typer.Typer(help="Open transactions: list, show, abort.", no_args_is_help=True)
token_app = typer.Typer(help="Auth: make a secret, make tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
app.add_typer(topics_app, name="topics")
app.add_typer(subs_app, name="subs")
app.add_typer(txns_app, name="txns")
console_app = typer.Typer(help="The operations console in the browser, and Grafana dashboards.")
app.add_typer(console_app, name="console")
console = Console(width=160)
err_console = Console(width=160, stderr=True)  # warnings, apart from what --json prints

Address = Annotated[str, typer.Option("--address", help="Ray cluster to attach to")]
Json = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


_token: str | None = None
_RAY = str(Path(sys.executable).with_name("ray"))


@app.callback()
def main(token: Annotated[str | None, typer.Option("--token", envvar="RAYTXN_TOKEN",
                                                   help="the token to present when auth is on")] = None) -> None:
    """raytxn: exactly-once transactional messaging on Ray."""
    global _token
    _token = token or None


@contextmanager
def _client(address: str = "auto", storage: str | None = None, **config: Any) -> Iterator[Any]:
    import raytxn as rt

    try:
        client = rt.connect(storage=storage, address=address, token=_token, **config)
    except ConnectionError as e:
        console.print(f"[red]no raytxn cluster at {address!r}: {e}. Start one with `raytxn start`.[/red]")
        raise typer.Exit(1) from e
    except RaytxnError as e:
        console.print(f"[red]{type(e).__name__}: {e}[/red]")
        raise typer.Exit(1) from e
    try:
        yield client
    except RaytxnError as e:
        console.print(f"[red]{type(e).__name__}: {e}[/red]")
        raise typer.Exit(1) from e
    finally:
        client.close()


def _emit(rows: list[dict[str, Any]] | dict[str, Any], as_json: bool, title: str,
          columns: list[str] | None = None) -> None:
    if as_json:
        print(json.dumps(rows, default=str))
        return
    items = rows if isinstance(rows, list) else [rows]
    table = Table(title=title)
    columns = columns or (list(items[0]) if items else [])
    for column in columns:
        table.add_column(column)
    for row in items:
        table.add_row(*(_cell(row.get(c)) for c in columns))
    console.print(table)


def _cell(value: Any) -> str:
    if isinstance(value, (list, dict)):
        return json.dumps(value, default=str)
    return "" if value is None else str(value)


# --- cluster -------------------------------------------------------------------------------------


@app.command()
def start(storage: Annotated[str, typer.Option("--storage", help="storage URL")] = "file://./.raytxn-data",
          num_cpus: Annotated[int | None, typer.Option("--num-cpus")] = None,
          auth_secret_file: Annotated[Path | None, typer.Option(
              "--auth-secret-file", help="turn auth on: the secret tokens are signed with")] = None,
          superuser: Annotated[list[str] | None, typer.Option(
              "--superuser", help="a superuser principal (repeat; default admin)")] = None,
          write_format: Annotated[int | None, typer.Option(
              "--write-format", help="the storage format to write (default: the previous release's newest; "
                                     "see Formats and upgrades)")] = None) -> None:
    """Start a local Ray cluster (if none runs) and the raytxn engine on it."""
    import ray

    config: dict[str, Any] = {}
    if write_format is not None:
        config["storage_options"] = {"write_format": write_format}
    if auth_secret_file is not None:
        config["auth_secret"] = _read_secret(auth_secret_file)
    if superuser:
        config["superusers"] = tuple(superuser)
    address = "auto"
    if subprocess.run([_RAY, "status"], capture_output=True).returncode != 0:
        with console.status("starting Ray"):
            address = local_ray.start(_RAY, num_cpus).address  # recorded for `raytxn stop`
    with _client(address, storage, **config) as client:
        console.print(f"raytxn running: storage {client.config.storage_url}, "
                      f"{client.config.coordinator.num_coordinators} coordinators, "
                      f"auth {'on' if client.config.auth.enabled else 'off'}")
    ray.shutdown()


def _read_secret(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as e:
        console.print(f"[red]cannot read the secret file {path}: {e}[/red]")
        raise typer.Exit(2) from e


@app.command()
def stop(address: Address = "auto") -> None:
    """Stop the engine's actors, then the local Ray cluster if `raytxn start` started it (a Ray
    cluster someone else started keeps running: `ray stop` would end every Ray on the machine)."""
    import raytxn as rt

    started = local_ray.recorded()
    if started is not None and address == "auto":
        address = started.address  # the Ray `raytxn start` started, not whichever Ray is newest
    with _client(address):
        pass
    try:
        rt.shutdown(token=_token)
    except RaytxnError as e:
        console.print(f"[red]{type(e).__name__}: {e}[/red]")
        raise typer.Exit(1) from e
    if started is not None and address == started.address:
        ended = local_ray.stop(started)  # its own processes, by pid: no other Ray on the machine
        console.print(f"stopped the engine and the Ray `raytxn start` started ({ended} processes)")
    else:
        console.print("stopped the engine (Ray was not started by `raytxn start`: left running)")


@app.command()
def status(address: Address = "auto", as_json: Json = False) -> None:
    """Health of every actor: state (ALIVE, DORMANT: passivated or not used yet, ...), the host
    serving it (with actor_hosts), incarnation, restarts, last recovery, activations and
    passivations; and how many are active and dormant."""
    with _client(address) as client:
        health = client.health()
    if as_json:
        print(json.dumps(health, default=str))
        return
    _emit(health["actors"], False, f"raytxn status ({'healthy' if health['healthy'] else 'DEGRADED'}, "
          f"{health['active']} active and {health['dormant']} dormant actors, storage {health['storage']})",
          ["name", "kind", "state", "host", "incarnation", "restarts", "recovery_ms", "activations", "passivations"])
    if not health["healthy"]:
        raise typer.Exit(1)


@app.command()
def restart(rolling: Annotated[bool, typer.Option(
                "--rolling", help="one actor at a time, each drained first (the only way: required)")] = False,
            drain_s: Annotated[float, typer.Option(
                "--drain-s", min=0, max=120, help="how long each actor may finish its calls in flight")] = 10.0,
            address: Address = "auto", as_json: Json = False) -> None:
    """Superusers: restart every running engine actor one at a time (partitions, subscriptions,
    coordinators, hosts, then the supervisor), each drained first, the next once it serves
    again. Producers, consumers and transactions go on meanwhile. Run it after installing a new
    release where the actors run: that is an upgrade."""
    if not rolling:
        console.print("[red]say --rolling: raytxn restarts its actors one at a time, so that the engine keeps "
                      "serving (to stop everything, use `raytxn stop`)[/red]")
        raise typer.Exit(2)
    with _client(address) as client:
        printer = None if as_json else (lambda row: console.print(
            f"restarted {row['name']} ({row['kind']}) in {row['seconds']}s"
            + ("" if row.get("restarted", True) else f": {row.get('why')}"), markup=False))
        rows = client.rolling_restart(drain_s, progress=printer)
    if as_json:
        print(json.dumps(rows, default=str))
        return
    console.print(f"rolling restart done: {sum(bool(r.get('restarted')) for r in rows)} actors restarted, "
                  f"{sum(r['seconds'] for r in rows):.1f}s")


@app.command()
def kafka(port: Annotated[int, typer.Option("--port", help="TCP port Kafka clients connect to (0: any free)")] = 9092,
          bind_host: Annotated[str, typer.Option(
              "--bind-host", help="interface to listen on (another than loopback with auth off: a warning)")
          ] = "127.0.0.1",
          advertised_host: Annotated[str | None, typer.Option(
              "--advertised-host", help="host clients are told to connect to (default: the node's IP)")] = None,
          initial_rebalance_delay_ms: Annotated[int | None, typer.Option(
              "--initial-rebalance-delay-ms",
              help="how long a group's first rebalance waits for more members (Kafka's "
                   "group.initial.rebalance.delay.ms; default: Kafka's, 3000)")] = None,
          tls_cert: Annotated[Path | None, typer.Option("--tls-cert", help="PEM certificate chain: serve TLS")] = None,
          tls_key: Annotated[Path | None, typer.Option("--tls-key", help="PEM private key of --tls-cert")] = None,
          tls_client_ca: Annotated[Path | None, typer.Option(
              "--tls-client-ca", help="PEM CA: clients must present a certificate it signed (mTLS)")] = None,
          gateways: Annotated[int | None, typer.Option(
              "--gateways", help="start a peer group of this many gateways, one Kafka cluster to clients "
                                 "(0: one per node); each node's k-th serves --port + k")] = None,
          peer_group: Annotated[str, typer.Option("--peer-group", help="name of the --gateways group")] = "default",
          address: Address = "auto", as_json: Json = False) -> None:
    """Start a Kafka-protocol gateway actor on the cluster: Kafka clients (confluent-kafka,
    kafka-python, kcat) then produce and fetch with bootstrap.servers set to the address shown.
    With --gateways, several: Metadata lists them all, any serves any partition, and a client
    is pointed at the gateways of its zone first (``zone=...`` in its client.id).
    With the engine's authentication on, each client logs in with SASL PLAIN (username: its
    raytxn principal, password: its token) or OAUTHBEARER (its token) and acts as that principal."""
    try:  # the gateway comes with the `kafka` extra: without it, its error, not a traceback
        from raytxn.kafka.gateway import start_gateway, start_gateways
        from raytxn.kafka.groups import INITIAL_REBALANCE_DELAY_MS
    except MissingExtra as e:
        console.print(str(e), style="red", markup=False)
        raise typer.Exit(2) from None
    delay_ms = INITIAL_REBALANCE_DELAY_MS if initial_rebalance_delay_ms is None else initial_rebalance_delay_ms
    options = {"bind_host": bind_host, "advertised_host": advertised_host, "initial_rebalance_delay_ms": delay_ms,
               "tls_cert": tls_cert, "tls_key": tls_key, "tls_client_ca": tls_client_ca}
    with _client(address) as client:
        coordinators = client.config.coordinator.num_coordinators
        if gateways is None:
            gateway = start_gateway(port, num_coordinators=coordinators, **options)
        else:
            group = start_gateways(gateways or None, port, peer_group=peer_group, num_coordinators=coordinators,
                                   **options)
            for one in group:
                one.pop("actor")
            gateway = {**group[0], "bootstrap": ",".join(g["bootstrap"] for g in group), "gateways": group}
    gateway.pop("actor", None)
    if gateway.get("warning"):
        err_console.print(f"[bold yellow]warning:[/] {gateway['warning']}")
    if as_json:
        print(json.dumps(gateway))
        return
    security = ("SASL_SSL" if gateway["tls"] else "SASL_PLAINTEXT") if gateway["auth"] else (
        "SSL" if gateway["tls"] else "PLAINTEXT")
    console.print(f"Kafka gateway serving; bootstrap.servers={gateway['bootstrap']} security.protocol={security}"
                  + (" (client certificates required)" if gateway["mtls"] else ""))


@console_app.callback(invoke_without_command=True)
def console_command(ctx: typer.Context,
                    port: Annotated[int, typer.Option(
                        "--port", help="TCP port of the web console (0: any free)")] = 8080,
                    bind_host: Annotated[str, typer.Option(
                        "--bind-host", help="interface to listen on (another than loopback: put TLS in front)")
                    ] = "127.0.0.1",
                    refresh_s: Annotated[float, typer.Option(
                        "--refresh-s", help="how old the shared stats of live actors may get before a page "
                                            "refreshes them")] = 2.0,
                    address: Address = "auto", as_json: Json = False) -> None:
    """Start the web console on the cluster (a Ray actor serving --port): topics, subscriptions and
    Kafka groups with their backlog in messages, transactions (a superuser may abort one),
    a message browser showing each message's transaction state, health. Users log in with a
    raytxn token and act as its principal. `raytxn console stop` ends it; `raytxn console
    grafana` writes Grafana dashboards of the engine's metrics."""
    if ctx.invoked_subcommand is not None:
        return
    from raytxn.console.app import start_console

    try:  # its error before anything starts, as `raytxn kafka` does
        require_extra("console")
    except MissingExtra as e:
        console.print(str(e), style="red", markup=False)
        raise typer.Exit(2) from None
    with _client(address):
        try:
            served = start_console(port, bind_host=bind_host, refresh_s=refresh_s)
        except (MissingExtra, RaytxnError) as e:
            console.print(f"{type(e).__name__}: {e}", style="red", markup=False)
            raise typer.Exit(2 if isinstance(e, MissingExtra) else 1) from None
    served.pop("actor")
    if served.get("warning"):
        err_console.print(f"[bold yellow]warning:[/] {served['warning']}")
    if as_json:
        print(json.dumps(served))
        return
    console.print(f"raytxn console serving at {served['url']}"
                  + (" (log in with a raytxn token)" if served["auth"] else " (auth off: no login)"))


@console_app.command("stop")
def console_stop(port: Annotated[int, typer.Option("--port", help="the console's port")] = 8080,
                 address: Address = "auto") -> None:
    """End the console serving --port."""
    from raytxn.console.app import stop_console

    with _client(address):
        stopped = stop_console(port)
    console.print(f"stopped the console on port {port}" if stopped else f"no console serves port {port}")


@console_app.command("grafana")
def console_grafana(out: Annotated[Path, typer.Option("--out", help="folder to write the dashboards' JSON into")]
                    = Path("grafana")) -> None:
    """Write Grafana dashboards of the engine's metrics (Prometheus data source; import them in
    Grafana or provision the folder)."""
    from raytxn.console.grafana import write_dashboards

    for path in write_dashboards(out):
        console.print(f"wrote {path}")


# --- topics ----------------------------------------------------------------------------------------


@topics_app.command("create")
def topics_create(name: str, partitions: Annotated[int, typer.Option("--partitions", "-p")] = 1,
                  retention_bytes: Annotated[int | None, typer.Option(
                      help="keep at least this many bytes of acked data per partition")] = None,
                  retention_s: Annotated[float | None, typer.Option(
                      help="keep acked data this many seconds")] = None,
                  compacted: Annotated[bool, typer.Option(
                      help="keep the latest value of each key (keyed messages only)")] = False,
                  compaction_threshold_bytes: Annotated[int | None, typer.Option(
                      help="a compacted partition compacts once this many live bytes lie above its horizon")] = None,
                  address: Address = "auto") -> None:
    with _client(address) as client:
        client.create_topic(name, partitions, retention_bytes=retention_bytes, retention_s=retention_s,
                            compacted=compacted, compaction_threshold_bytes=compaction_threshold_bytes)
    console.print(f"created {name} with {partitions} partition(s){', compacted' if compacted else ''}")


@topics_app.command("list")
def topics_list(address: Address = "auto", as_json: Json = False) -> None:
    with _client(address) as client:
        _emit(client.list_topics(), as_json, "topics", ["name", "partitions", "subscriptions", "created_ms"])


@topics_app.command("stats")
def topics_stats(name: str, address: Address = "auto", as_json: Json = False) -> None:
    with _client(address) as client:
        stats = client.topic_stats(name)
    if as_json:
        print(json.dumps(stats, default=str))
        return
    _emit(stats["partition_stats"], False, f"topic {name}",
          ["partition", "incarnation", "applied_entries", "max_read_position", "last_position", "ongoing_txns",
           "aborted_txns", "oldest_ongoing", "oldest_ongoing_age_ms", "duplicates"])


@topics_app.command("browse")
def topics_browse(name: str, partition: Annotated[int, typer.Option("--partition", "-p")] = 0,
                  offset: Annotated[int | None, typer.Option(
                      "--offset", help="the first Kafka offset (default: the last --count offsets)")] = None,
                  count: Annotated[int, typer.Option("--count", "-n", min=1, max=500)] = 20,
                  address: Address = "auto", as_json: Json = False) -> None:
    """A partition's messages with their transactions' states (committed, aborted, pending) and
    the transaction markers, as the console's message browser shows them (consume permission)."""
    with _client(address) as client:
        page = client.browse(name, partition, offset, count)
    if page["out_of_range"]:
        console.print(f"[red]offset {offset} is outside {name}/{partition}: "
                      f"{page['log_start']}..{page['high_watermark']}[/red]")
        raise typer.Exit(2)
    if as_json:
        print(json.dumps(page, default=str))
        return
    _emit(page["rows"], False, f"{name}/{partition} offsets {page['log_start']}..{page['high_watermark']}",
          ["offset", "position", "kind", "state", "txn", "key", "value_preview", "readable"])


@topics_app.command("delete")
def topics_delete(name: str, address: Address = "auto") -> None:
    with _client(address) as client:
        client.delete_topic(name)
    console.print(f"deleted {name}")


@topics_app.command("compact")
def topics_compact(name: str, partition: Annotated[int | None, typer.Option(
                       help="one partition (default: all)")] = None,
                   delete_retention_ms: Annotated[int, typer.Option(
                       help="keep tombstones this long after the first compaction that kept them")
                   ] = DEFAULT_DELETE_RETENTION_MS,
                   address: Address = "auto", as_json: Json = False) -> None:
    """Compact NAME up to what is committed now: below the horizon, each key's latest value."""
    with _client(address) as client:
        rows = client.compact(name, partition, delete_retention_ms=delete_retention_ms)
    _emit(rows, as_json, f"compacted {name}", ["partition", "generation", "horizon", "next_offset", "records",
                                               "tombstones", "skipped_aborted", "skipped_keyless",
                                               "dropped_tombstones"])


@topics_app.command("grant")
def topics_grant(topic: str, principal: str,
                 actions: Annotated[str, typer.Option("--actions", help="produce,consume or one")] = "produce,consume",
                 address: Address = "auto") -> None:
    """Superusers: let PRINCIPAL produce to and/or consume from TOPIC (replaces its earlier grant)."""
    with _client(address) as client:
        granted = client.grant_permission(topic, principal, [a.strip() for a in actions.split(",") if a.strip()])
    console.print(f"{topic}: {principal} may {', '.join(granted[principal])}")


@topics_app.command("revoke")
def topics_revoke(topic: str, principal: str, address: Address = "auto") -> None:
    """Superusers: take every permission on TOPIC from PRINCIPAL."""
    with _client(address) as client:
        client.revoke_permission(topic, principal)
    console.print(f"{topic}: {principal} has no permissions")


@topics_app.command("permissions")
def topics_permissions(topic: str, address: Address = "auto", as_json: Json = False) -> None:
    """Superusers: who may do what on TOPIC."""
    with _client(address) as client:
        granted = client.permissions(topic)
    _emit([{"principal": p, "actions": a} for p, a in sorted(granted.items())], as_json, f"permissions on {topic}",
          ["principal", "actions"])


# --- auth --------------------------------------------------------------------------------------


@token_app.command("secret")
def token_secret(output: Annotated[Path | None, typer.Option("--output", "-o", help="write it here")] = None) -> None:
    """Make a new random secret (give it to `raytxn start --auth-secret-file`)."""
    from raytxn.auth import new_secret

    secret = new_secret()
    if output is None:
        print(secret)
        return
    output.touch(mode=0o600)
    output.write_text(secret + "\n")
    console.print(f"secret written to {output}")


@token_app.command("create")
def token_create(principal: Annotated[str, typer.Option("--principal", help="who the token names")],
                 secret_file: Annotated[Path, typer.Option("--secret-file", help="the cluster's secret")],
                 expires_in: Annotated[float | None, typer.Option("--expires-in", help="seconds of validity")] = None,
                 ) -> None:
    """Make a token for PRINCIPAL signed with the cluster's secret (prints it)."""
    from raytxn.auth import create_token

    try:
        expires = None if expires_in is None else time.time() + expires_in
        print(create_token(_read_secret(secret_file), principal, expires))
    except RaytxnError as e:
        console.print(f"[red]{type(e).__name__}: {e}[/red]")
        raise typer.Exit(2) from e


@app.command()
def whoami(address: Address = "auto", as_json: Json = False) -> None:
    """The principal this token names, and whether it is a superuser."""
    with _client(address) as client:
        info = client.whoami()
    _emit(info, as_json, "whoami", ["auth", "principal", "superuser"])


# --- subscriptions -----------------------------------------------------------------------------


@subs_app.command("list")
def subs_list(topic: str, address: Address = "auto", as_json: Json = False) -> None:
    with _client(address) as client:
        info = client.get_topic(topic)
    _emit([{"topic": topic, "subscription": s} for s in info["subscriptions"]], as_json, f"subscriptions of {topic}")


@subs_app.command("stats")
def subs_stats(topic: str, subscription: str, address: Address = "auto", as_json: Json = False) -> None:
    """Each partition's cursor, consumers, leases and backlog: ``backlog_messages`` counts the
    messages still to consume (markers and aborted messages not), ``backlog_entries`` entries."""
    with _client(address) as client:
        rows = client.subscription_stats(topic, subscription)
    _emit(rows, as_json, f"{topic} / {subscription}", None if as_json else
          ["partition", "type", "backlog_messages", "backlog_exact", "backlog_entries", "unacked",
           "mark_delete_position", "consumers", "leases", "pending_ack"])


@subs_app.command("reset")
def subs_reset(topic: str, subscription: str,
               to: Annotated[str, typer.Option("--to", help="earliest, latest, or a publish time in ms")] = "earliest",
               address: Address = "auto") -> None:
    """Move the subscription's cursor (no consumer may be attached)."""
    from raytxn.client.rpc import ActorRef
    from raytxn.ids import Position, subscription_actor_name

    with _client(address) as client:
        partitions = client.get_topic(topic)["partitions"]
        for p in range(partitions):
            ref = ActorRef(subscription_actor_name(topic, p, subscription), client.token)
            if to == "earliest":
                ref.call("seek", Position(-1, -1))
            elif to == "latest":
                ref.call("seek", None, int(time.time() * 1000) + 10**9)
            else:
                ref.call("seek", None, int(to))
    console.print(f"reset {topic}/{subscription} to {to}")


# --- transactions ------------------------------------------------------------------------------


@txns_app.command("list")
def txns_list(address: Address = "auto", as_json: Json = False,
              older_than: Annotated[str, typer.Option(
                  "--older-than", help="only those begun at least this long ago: 30s, 5m, 1h, 250ms")] = "0s",
              limit: Annotated[int, typer.Option("--limit", min=1)] = 50) -> None:
    """Live transactions on every coordinator, the oldest first, with their age and participants
    (superusers): the hanging ones are the old ones."""
    from raytxn.config import parse_duration

    seconds = _usage(parse_duration, older_than)
    with _client(address) as client:
        rows = client.list_transactions(seconds, limit)
    _emit(rows, as_json, "live transactions" + (f" older than {older_than}" if seconds else ""),
          ["txn", "state", "owner", "age_ms", "deadline_in_ms", "partitions", "subscriptions", "transactional_id"])


def _usage(parse: Callable[[str], Any], text: str) -> Any:
    """``parse(text)``; a malformed argument is a usage error (exit 2)."""
    try:
        return parse(text)
    except RaytxnError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from e


@txns_app.command("show")
def txns_show(txn: str, address: Address = "auto", as_json: Json = False) -> None:
    """One transaction: state, owner, age, deadline, participants (or its outcome once ended)."""
    from raytxn.ids import parse_txn_id

    txn_id = _usage(parse_txn_id, txn)
    with _client(address) as client:
        info = client.describe_transaction(txn_id)
    _emit(info, as_json, str(txn_id))


@txns_app.command("recent")
def txns_recent(limit: Annotated[int, typer.Option("--limit", min=1)] = 20,
                address: Address = "auto", as_json: Json = False) -> None:
    """How the transactions that finished last ended, per coordinator (superusers)."""
    with _client(address) as client:
        rows = client.recent_transactions(limit)
    _emit(rows, as_json, "recent outcomes", ["txn", "outcome"])


@txns_app.command("abort")
def txns_abort(txn: str, address: Address = "auto") -> None:
    """Abort a transaction whoever owns it (superusers)."""
    from raytxn.ids import parse_txn_id

    txn_id = _usage(parse_txn_id, txn)
    with _client(address) as client:
        state = client.abort_transaction(txn_id)
    console.print(f"{txn_id}: {state}")


# --- debugging: produce and consume ----------------------------------------------------------


@app.command()
def produce(topic: str, value: Annotated[list[str], typer.Argument(help="message values")],
            key: Annotated[str | None, typer.Option("--key")] = None,
            txn: Annotated[bool, typer.Option("--txn", help="send all in one transaction")] = False,
            address: Address = "auto", as_json: Json = False) -> None:
    """Send messages (in one transaction with --txn)."""
    with _client(address) as client:
        producer = client.create_producer(topic)
        transaction = client.new_transaction() if txn else None
        ids = [producer.send(v.encode(), key=key, txn=transaction) for v in value]
        if transaction is not None:
            transaction.commit()
    _emit([{"value": v, "message_id": str(i)} for v, i in zip(value, ids, strict=True)], as_json, f"sent to {topic}")


@app.command()
def consume(topic: str, subscription: str, count: Annotated[int, typer.Option("--count", "-n")] = 10,
            timeout: Annotated[float, typer.Option("--timeout")] = 2.0,
            earliest: Annotated[bool, typer.Option("--earliest", help="a new subscription starts at the start")] = True,
            ack: Annotated[bool, typer.Option("--ack/--no-ack")] = True,
            address: Address = "auto", as_json: Json = False) -> None:
    """Receive (and acknowledge) up to COUNT messages."""
    import raytxn as rt

    rows = []
    with _client(address) as client:
        consumer = client.subscribe(topic, subscription, consumer_type=rt.ConsumerType.Shared,
                                    initial_position="earliest" if earliest else "latest")
        while len(rows) < count:
            try:
                msg = consumer.receive(timeout=timeout)
            except rt.errors.Timeout:
                break
            rows.append({"message_id": str(msg.message_id()), "key": msg.key(),
                         "value": msg.value().decode(errors="replace"), "publish_time": msg.publish_time(),
                         "redeliveries": msg.redelivery_count()})
            if ack:
                consumer.acknowledge(msg)
        consumer.close()
    _emit(rows, as_json, f"{topic} / {subscription}", ["message_id", "key", "value", "publish_time", "redeliveries"])


# --- benchmarks and chaos ----------------------------------------------------------------------


@app.command("bench")
def bench_command(
    names: Annotated[list[str] | None, typer.Argument(help=f"benchmarks: {', '.join(bench.BENCHMARKS)}")] = None,
    short: Annotated[bool, typer.Option("--short", help="small sizes, for a CI smoke run")] = False,
    out: Annotated[Path, typer.Option("--out", help="JSON file to write")] = Path("bench-results/bench.json"),
    minutes: Annotated[float | None, typer.Option(
        "--minutes", min=0, help="bench soak: how long it runs (default 30; --short: 1)")] = None,
    sizes: Annotated[list[str] | None, typer.Option(
        "--size", help="KEY=VALUE, a size option of the one benchmark run (" + "; ".join(
            f"bench {name}: {', '.join(keys)}" for name, keys in bench.SIZE_OPTIONS.items()) + "); repeat for more")
    ] = None,
) -> None:
    """Run benchmarks, print their tables (every figure of every row), write JSON and a chart."""
    names = names or list(bench.BENCHMARKS)
    unknown = [n for n in names if n not in bench.BENCHMARKS]
    if unknown:
        console.print(f"[red]unknown benchmark(s): {', '.join(unknown)}[/red]")
        raise typer.Exit(2)
    try:
        for extra in bench.required_extras(names):
            require_extra(extra)
    except MissingExtra as e:
        console.print(str(e), style="red", markup=False)
        raise typer.Exit(2) from None
    try:
        size = bench.parse_sizes(sizes or [], names)
        if minutes is not None:
            if names != ["soak"]:
                raise ValueError("--minutes is for bench soak alone")
            size["minutes"] = minutes
    except ValueError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    rows: list[dict] = []
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarks", total=len(names))
        for name in names:
            progress.update(task, description=f"bench {name}")
            rows += _run_bench(bench.BENCHMARKS[name], short, progress.console.print, size)
            progress.advance(task)
    bench.write_results(rows, out)
    print(bench.render_results(rows), end="")
    console.print(f"wrote {out} and {out.with_suffix('.png')}")


def _run_bench(fn: Callable[..., list[dict]], short: bool, printer: Callable[[str], None],
               size: dict[str, object] | None = None) -> list[dict]:
    return fn(short=short, progress=printer, **(size or {}))


@app.command("chaos")
def chaos_command(
    txns: Annotated[int, typer.Option("--txns", help="orders to move, one transaction each")] = 500,
    seed: Annotated[int, typer.Option("--seed", help="the fault schedule's seed (replays exactly)")] = 1,
    workers: Annotated[int, typer.Option("--workers")] = 3,
    storage: Annotated[str | None, typer.Option("--storage", help="storage URL (default: a new temp dir)")] = None,
    fault_interval_s: Annotated[float, typer.Option("--fault-interval")] = 1.0,
    partitions: Annotated[str, typer.Option("--partitions", help="IN,OUT_A,OUT_B partitions")] = "3,2,2",
    passivate_idle_s: Annotated[float | None, typer.Option(
        "--passivate-idle-s", help="passivate actors idle this long during the run (default: the engine's)")] = None,
    dormant_ratio: Annotated[float, typer.Option(
        "--dormant-ratio", help="share of partition/subscription kills that are for good (dormant)")] = 0.0,
    as_json: Json = False,
) -> None:
    """Run the chaos workload under a seeded fault schedule and check it exactly-once."""
    import tempfile

    import raytxn as rt
    from raytxn.tools.chaos import run_chaos

    try:
        sizes = tuple(int(n) for n in partitions.split(","))
        if len(sizes) != 3:
            raise ValueError(partitions)
    except ValueError:
        raise typer.BadParameter(f"--partitions takes three numbers such as 3,2,2, not {partitions!r}") from None
    config = {} if passivate_idle_s is None else {"passivate_idle_s": passivate_idle_s}
    client = rt.connect(storage=storage or f"file://{tempfile.mkdtemp(prefix='raytxn-chaos-')}", **config)
    try:
        result = run_chaos(client, txns=txns, seed=seed, workers=workers, fault_interval_s=fault_interval_s,
                           progress=None if as_json else console.print, partitions=sizes,  # type: ignore[arg-type]
                           dormant_ratio=dormant_ratio)
    finally:
        client.close()
        rt.shutdown()
    if as_json:
        print(json.dumps({"seed": seed, "txns": txns, "clean": result.clean, "committed": result.committed,
                          "aborted": result.aborted, "seconds": round(result.seconds, 1),
                          "faults": len(result.schedule), "anomalies": result.report.summary(),
                          "errors": result.errors}))
    else:
        console.print(result.summary())
    if not result.clean:
        raise typer.Exit(1)


@app.command("sim")
def sim_command(
    seeds: Annotated[int | None, typer.Option(
        "--seeds", min=1, help="how many seeds to run (default 100; with --minutes, at most this many)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="the first seed")] = 0,
    minutes: Annotated[float | None, typer.Option(
        "--minutes", min=0, help="run seeds one after another until this much time has passed (a long run)")] = None,
    faults: Annotated[str, typer.Option("--faults", help="a fault profile (raytxn.sim.profiles: none, default, "
                                                         "heavy, ...), or all: each seed one of the faulty "
                                                         "profiles in turn")] = "default",
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1, help="processes running seeds in parallel")] = 1,
    trace: Annotated[bool, typer.Option("--trace", help="print each failing seed's trace")] = False,
    schedule: Annotated[str, typer.Option(
        "--schedule", help="a smaller run of each seed, e.g. 'workers=1,max_txns=40,no=zombie+drop,max_faults=7' "
                           "(what --shrink prints)")] = "",
    check: Annotated[str | None, typer.Option(
        "--check", help="module:function: an extra property of each run's history (a message fails the run)")] = None,
    shrink: Annotated[bool, typer.Option("--shrink", help="shrink each failing seed to a smaller schedule")] = False,
    shrink_runs: Annotated[int, typer.Option("--shrink-runs", min=1, help="runs each shrink may make")] = 200,
    shrink_seconds: Annotated[float, typer.Option("--shrink-seconds", min=0, help="time each shrink may take")] = 300.0,
    reintroduce: Annotated[list[str] | None, typer.Option(
        "--reintroduce", help="test only: run with this fixed bug brought back (a name in "
                              "raytxn.testing_bugs), to see the simulator find it")] = None,
) -> None:
    """Simulate the real actors deterministically, one run per seed, and check every run; prints
    one line per failing seed with the command that replays it (and, with --shrink, the smallest
    schedule found that fails the same way, with the command that replays that)."""
    from raytxn.sim.profiles import ALL_PROFILES, PROFILES
    from raytxn.sim.run import SeedResult, load_check, run_many
    from raytxn.sim.schedule import parse_schedule
    from raytxn.sim.shrink import shrink as shrink_seed
    from raytxn.testing_bugs import check_names, reintroduced

    if faults not in PROFILES and faults != ALL_PROFILES:
        console.print(f"[red]--faults must be one of {', '.join(PROFILES)} or {ALL_PROFILES}[/red]")
        raise typer.Exit(2)
    try:
        check_names(reintroduce or [])
    except ValueError as error:
        console.print(f"--reintroduce: {error}", style="red", markup=False)
        raise typer.Exit(2) from None
    try:
        overrides = parse_schedule(schedule)
        extra_check = None if check is None else load_check(check)
    except RaytxnError as error:
        console.print(f"{error}", markup=False, style="red")
        raise typer.Exit(2) from None

    def failed_line(result: SeedResult) -> str:
        return (f"seed {result.seed} FAILED: {(result.failure or '').splitlines()[0]}  trace {result.digest[:12]}  "
                f"replay: {result.replay_command()}")

    if seeds is None:
        # With a time limit the seed count is only a bound; seeds are made lazily, so it costs nothing.
        seeds = 100 if minutes is None else 10**9
    began = time.perf_counter()
    deadline = None if minutes is None else began + minutes * 60
    failing = txns = ran = 0
    injected: dict[str, int] = {}
    results = run_many(range(seed, seed + seeds), faults, jobs, keep_trace=trace, schedule=overrides,
                       extra_check=extra_check, reintroduce=reintroduce or ())
    for result in results:
        ran += 1
        txns += result.txns
        for kind, count in result.faults.items():
            injected[kind] = injected.get(kind, 0) + count
        if not result.ok:
            failing += 1
            console.print(failed_line(result), markup=False, soft_wrap=True)
            if trace and result.trace_lines:
                sys.stdout.write("".join(result.trace_lines))
            if shrink:
                with reintroduced(*(reintroduce or ())):  # the shrink's runs are in this process
                    shrunk = shrink_seed(result.seed, faults, schedule=overrides, extra_check=extra_check,
                                         original=result, max_runs=shrink_runs, max_seconds=shrink_seconds)
                console.print(f"  {shrunk.summary()}", markup=False, soft_wrap=True)
                console.print(f"  smallest: {failed_line(shrunk.shrunk)}", markup=False, soft_wrap=True)
        if deadline is not None and time.perf_counter() >= deadline:
            break
    results.close()  # ends a --jobs pool still running seeds past the deadline
    elapsed = time.perf_counter() - began
    bugs = f", reintroduced: {', '.join(reintroduce)}" if reintroduce else ""
    last = f" ({seed}..{seed + ran - 1})" if minutes is not None else ""
    console.print(f"{ran} seeds{last} ({faults}{bugs}), {failing} failing, {ran / elapsed:.1f} seeds/s, "
                  f"{txns / max(ran, 1):.0f} txns/seed, {elapsed / 60:.1f} min, injected: {injected}",
                  markup=False)
    if failing:
        raise typer.Exit(1)


@app.command("version")
def version() -> None:
    """Print the version."""
    from importlib.metadata import version as dist_version

    console.print(dist_version("raytxn"))


if __name__ == "__main__":
    app()
