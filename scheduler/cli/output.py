"""Rendering API messages for a terminal (tables, key-value blocks) and for scripts (``--json``).

Every function here is pure: it takes protobuf messages and returns text or plain dicts, so
the formats are unit-tested without a server.

JSON conventions (``--json``): keys are the proto field names; timestamps and durations are the
protobuf JSON strings (RFC 3339 in UTC, ``"90s"``); enum values lose their type prefix
(``SCHEDULE_STATE_ACTIVE`` -> ``ACTIVE``); ``bytes`` fields (the payload) appear as the JSON
value they hold when they are UTF-8 JSON, else as base64; int64 values are JSON numbers.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from google.protobuf import json_format
from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from cronscale.v1 import schedule_pb2

# The run states after which a run changes no more (a retry of a FAILED attempt is a new attempt).
TERMINAL_RUN_STATUSES = frozenset(
    {
        schedule_pb2.RUN_STATUS_SUCCEEDED,
        schedule_pb2.RUN_STATUS_FAILED,
        schedule_pb2.RUN_STATUS_SKIPPED,
        schedule_pb2.RUN_STATUS_DEAD_LETTERED,
        schedule_pb2.RUN_STATUS_CANCELLED,
    }
)


# --------------------------------------------------------------------------------------------
# JSON


def message_to_json(message: Message) -> dict[str, Any]:
    """The ``--json`` form of ``message``: proto field names, bare enum names, decoded payload.

    Fields without presence (strings, numbers, enums, bytes) are always included, so scripts
    can rely on the keys; unset message fields (e.g. ``next_fire_time`` of a schedule that will
    not fire again) are left out.
    """
    data = json_format.MessageToDict(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        unquote_int64_if_possible=True,
    )
    _rewrite(message, data)
    return data


def dumps(data: Any) -> str:
    """Pretty JSON as the CLI prints it (two-space indent, non-ASCII kept)."""
    return json.dumps(data, indent=2, ensure_ascii=False)


def enum_prefix(enum: EnumDescriptor) -> str:
    """The prefix all values of ``enum`` carry by the style guide: ``ScheduleState`` ->
    ``SCHEDULE_STATE_``. Empty when the values do not all carry it."""
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    if all(value.name.startswith(prefix) for value in enum.values):
        return prefix
    return ""


def enum_name(enum: EnumDescriptor, number: int) -> str:
    """The value's name without its type prefix (``RUN_STATUS_SUCCEEDED`` -> ``SUCCEEDED``); the
    number itself for a value this build does not know (a newer server)."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    return value.name.removeprefix(enum_prefix(enum))


def decode_bytes(raw: bytes) -> Any:
    """A bytes field for display: the JSON value when it is UTF-8 JSON, else base64 text."""
    try:
        return json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return base64.b64encode(raw).decode("ascii")


def _rewrite(message: Message, data: dict[str, Any]) -> None:
    """Walks ``message``'s descriptor next to its MessageToDict output, fixes enums and bytes,
    and puts the keys in the order the .proto declares them (MessageToDict appends the
    default-valued ones)."""
    order = [f.name for f in message.DESCRIPTOR.fields if f.name in data]
    ordered = {name: data[name] for name in order}
    ordered.update(data)  # keeps anything unexpected, at the end
    data.clear()
    data.update(ordered)
    for upb_or_python in message.DESCRIPTOR.fields:
        # The stubs type descriptors as a union of the upb and pure-Python classes; both have
        # the same attributes.
        field = cast(FieldDescriptor, upb_or_python)
        key = field.name
        if key not in data:
            continue
        value = getattr(message, key)
        if _is_map(field):
            continue  # no map fields in the API yet; MessageToDict's form stands
        if field.is_repeated:
            items = zip(value, data[key], strict=True)
            data[key] = [_rewrite_value(field, item, out) for item, out in items]
        else:
            data[key] = _rewrite_value(field, value, data[key])


def _rewrite_value(field: FieldDescriptor, value: Any, rendered: Any) -> Any:
    if field.type == FieldDescriptor.TYPE_ENUM and field.enum_type is not None:
        return enum_name(field.enum_type, int(value))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return decode_bytes(bytes(value))
    # Well-known types (Timestamp, Duration) render as strings and are left as they are.
    if field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(rendered, dict):
        _rewrite(value, rendered)
    return rendered


def _is_map(field: FieldDescriptor) -> bool:
    entry = field.message_type
    return field.is_repeated and entry is not None and entry.GetOptions().map_entry


# --------------------------------------------------------------------------------------------
# Human output


def format_time(ts: Timestamp | None) -> str:
    """A timestamp as UTC ISO 8601 (``2026-12-02T15:00:05Z``; milliseconds when not whole);
    ``-`` when unset."""
    if ts is None or (ts.seconds == 0 and ts.nanos == 0):
        return "-"
    return format_datetime(ts.ToDatetime(tzinfo=UTC))


def format_datetime(value: datetime) -> str:
    """An aware datetime as UTC ISO 8601 with a ``Z``, milliseconds only when not whole."""
    value = value.astimezone(UTC)
    spec = "seconds" if value.microsecond == 0 else "milliseconds"
    return value.isoformat(timespec=spec).replace("+00:00", "Z")


def format_duration(duration: Duration) -> str:
    """A Duration as ``1h30m``, ``90s``, ``1.5s``; ``-`` when zero."""
    return format_timedelta(duration.ToTimedelta())


def format_timedelta(delta: timedelta) -> str:
    """A timedelta as ``1d2h3m4s`` (fractional seconds kept); ``-`` when zero."""
    if not delta:
        return "-"
    sign = "-" if delta < timedelta(0) else ""
    total = abs(delta)
    seconds = total.total_seconds()
    days, rest = divmod(int(seconds), 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, whole = divmod(rest, 60)
    frac = seconds - int(seconds)
    parts = [
        f"{days}d" if days else "",
        f"{hours}h" if hours else "",
        f"{minutes}m" if minutes else "",
    ]
    if whole or frac:
        parts.append(f"{whole + frac:.3f}".rstrip("0").rstrip(".") + "s")
    return sign + "".join(parts)


def format_spec(spec: schedule_pb2.ScheduleSpec) -> str:
    """A one-line description of when a schedule fires."""
    kind = spec.WhichOneof("kind")
    if kind == "cron":
        return f"cron {spec.cron.expression!r} ({spec.cron.timezone or 'UTC'})"
    if kind == "interval":
        text = f"every {format_duration(spec.interval.every)}"
        if spec.interval.HasField("anchor"):
            text += f" from {format_time(spec.interval.anchor)}"
        return text
    if kind == "once":
        return f"once at {format_time(spec.once.at)}"
    return "-"


def format_payload(raw: bytes) -> str:
    """The payload as compact JSON when it is JSON, else base64; ``-`` when empty."""
    if not raw:
        return "-"
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return "base64:" + base64.b64encode(raw).decode("ascii")
    return json.dumps(value, ensure_ascii=False)


def format_schedule(schedule: schedule_pb2.Schedule) -> str:
    """A schedule as an aligned key-value block."""
    rows: list[tuple[str, str]] = [
        ("id", schedule.id),
        ("name", schedule.name),
        ("tenant", schedule.tenant),
        ("handler", schedule.handler),
        ("spec", format_spec(schedule.spec)),
        ("state", enum_name(schedule_pb2.ScheduleState.DESCRIPTOR, schedule.state)),
        ("next_fire_time", format_time(_opt(schedule, "next_fire_time"))),
        ("payload", format_payload(schedule.payload)),
        ("max_runtime", format_duration(schedule.max_runtime)),
        ("version", str(schedule.version)),
        ("create_time", format_time(_opt(schedule, "create_time"))),
        ("update_time", format_time(_opt(schedule, "update_time"))),
    ]
    rows += _spec_policy_rows(schedule)
    if schedule.after:
        rows.append(("after", ", ".join(schedule.after)))
    if schedule.HasField("pause_time") or schedule.pause_note or schedule.paused_by:
        rows += [
            ("pause_note", schedule.pause_note or "-"),
            ("paused_by", schedule.paused_by or "-"),
            ("pause_time", format_time(_opt(schedule, "pause_time"))),
        ]
    return _key_values(rows)


def _spec_policy_rows(schedule: schedule_pb2.Schedule) -> list[tuple[str, str]]:
    """Bounds, run limit, jitter, DST rules (only those set) and the execution policies."""
    spec = schedule.spec
    rows: list[tuple[str, str]] = []
    if spec.cron.HasField("dst"):
        # An unset policy takes the expression's Debian-cron default.
        gap = enum_name(schedule_pb2.DstGapPolicy.DESCRIPTOR, spec.cron.dst.gap)
        overlap = enum_name(schedule_pb2.DstOverlapPolicy.DESCRIPTOR, spec.cron.dst.overlap)
        rows.append(("dst", f"gap {gap}, overlap {overlap}".replace("UNSPECIFIED", "default")))
    if spec.HasField("start_time"):
        rows.append(("start_time", format_time(spec.start_time)))
    if spec.HasField("end_time"):
        rows.append(("end_time", format_time(spec.end_time)))
    if spec.max_runs:
        rows.append(("max_runs", str(spec.max_runs)))
    if spec.HasField("jitter"):
        rows.append(("jitter", format_duration(spec.jitter)))
    if schedule.HasField("policies"):
        p = schedule.policies
        overlap = enum_name(schedule_pb2.OverlapPolicy.DESCRIPTOR, p.overlap)
        misfire = enum_name(schedule_pb2.MisfirePolicy.DESCRIPTOR, p.misfire)
        rows.append(("overlap", overlap))
        rows.append(
            (
                "misfire",
                f"{misfire} (catch-up window {format_duration(p.catch_up_window)}, "
                f"at most {p.max_catch_up})",
            )
        )
        if p.HasField("retry"):
            r = p.retry
            rows.append(
                (
                    "retry",
                    f"{r.max_attempts} attempts, backoff {format_duration(r.initial_backoff)} "
                    f"x{r.backoff_multiplier:g} up to {format_duration(r.max_backoff)}, "
                    f"jitter {0 if r.no_jitter else r.jitter:g}",
                )
            )
    return rows


def format_run(run: schedule_pb2.Run) -> str:
    """A run as an aligned key-value block."""
    rows: list[tuple[str, str]] = [
        ("run_id", run.run_id),
        ("schedule_id", run.schedule_id),
        ("tenant", run.tenant),
        ("status", enum_name(schedule_pb2.RunStatus.DESCRIPTOR, run.status)),
        ("attempt", str(run.attempt)),
        ("handler", run.handler),
        ("manual", "yes" if run.manual else "no"),
        ("scheduled_for", format_time(_opt(run, "scheduled_for"))),
        ("enqueue_time", format_time(_opt(run, "enqueue_time"))),
        ("start_time", format_time(_opt(run, "start_time"))),
        ("finish_time", format_time(_opt(run, "finish_time"))),
        ("start_lag", format_lag(run)),
        ("worker_id", run.worker_id or "-"),
    ]
    if run.error:
        rows.append(("error", run.error))
    if run.HasField("next_attempt_time"):
        rows.append(("next_attempt_time", format_time(run.next_attempt_time)))
    if run.skip_reason:
        rows.append(("skip_reason", run.skip_reason))
    return _key_values(rows)


def format_schedules_table(schedules: Sequence[schedule_pb2.Schedule]) -> str:
    """Schedules as a table: one row each."""
    header = ("ID", "NAME", "HANDLER", "STATE", "SPEC", "NEXT FIRE (UTC)")
    rows = [
        (
            s.id,
            s.name,
            s.handler,
            enum_name(schedule_pb2.ScheduleState.DESCRIPTOR, s.state),
            format_spec(s.spec),
            format_time(_opt(s, "next_fire_time")),
        )
        for s in schedules
    ]
    return _table(header, rows)


def format_runs_table(runs: Sequence[schedule_pb2.Run]) -> str:
    """Runs as a table: one row each, newest slot first as the server sends them."""
    header = ("RUN ID", "SCHEDULED FOR (UTC)", "STATUS", "ATTEMPT", "LAG", "FINISHED (UTC)", "NOTE")
    rows = [
        (
            r.run_id,
            format_time(_opt(r, "scheduled_for")),
            enum_name(schedule_pb2.RunStatus.DESCRIPTOR, r.status),
            str(r.attempt),
            format_lag(r),
            format_time(_opt(r, "finish_time")),
            _one_line(r.error or r.skip_reason or ("manual" if r.manual else ""), 60),
        )
        for r in runs
    ]
    return _table(header, rows)


def start_lag(run: schedule_pb2.Run) -> timedelta | None:
    """``start_time - scheduled_for``; None while the run has not started."""
    if not (run.HasField("start_time") and run.HasField("scheduled_for")):
        return None
    return run.start_time.ToDatetime() - run.scheduled_for.ToDatetime()


def format_lag(run: schedule_pb2.Run) -> str:
    """The start lag in seconds with milliseconds (``0.142s``); ``-`` when not started."""
    lag = start_lag(run)
    return "-" if lag is None else f"{lag.total_seconds():.3f}s"


def format_run_line(run: schedule_pb2.Run) -> str:
    """One line per finished run, as ``cronscale dev`` prints them:
    ``<scheduled_for>  lag <s>s  <handler>  <STATUS>  run <run_id>``."""
    status = enum_name(schedule_pb2.RunStatus.DESCRIPTOR, run.status)
    line = (
        f"{format_time(_opt(run, 'scheduled_for'))}  lag {format_lag(run):>7}  "
        f"{run.handler or '-'}  {status}  run {run.run_id}"
    )
    note = run.error or run.skip_reason
    if note:
        line += f"  ({_one_line(note, 120)})"
    return line


def _opt(message: Message, field: str) -> Any:
    return getattr(message, field) if message.HasField(field) else None


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _key_values(rows: Iterable[tuple[str, str]]) -> str:
    rows = list(rows)
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v if v != '' else '-'}" for k, v in rows)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "  ".join(header)
    cells = [list(header), *[[c if c != "" else "-" for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)
