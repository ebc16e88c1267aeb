"""Settings objects read from environment variables and command-line flags.

Every entry point of the pipeline describes its settings as a frozen dataclass whose fields carry
their environment variable and help text (`setting(...)`); `load_settings` turns that into a CLI.
Precedence: command-line flag, then environment variable, then the field's default.

Every value is checked at start, and a wrong one stops the stage with a message naming its flag and its
environment variable: a number must be finite and at least its field's `minimum` (0 unless said: counts,
sizes, durations); a port lies in 1-65535; a boolean in the environment is one of 1/0, true/false, yes/no,
on/off (anything else is an error, never quietly false). Names follow one scheme: a stage's variables
start with its name (`STREAM_CONNECTOR_`, `KAFKA_JOINER_`, ...), and a time value ends in its unit (`_s`,
`_ms`).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def setting(default: Any, env: str | None, help: str, *, secret: bool = False,
            formerly: tuple[str | None, str | None] | None = None, minimum: float | None = 0) -> Any:
    """A dataclass field with a default, the environment variable that overrides it, and help. A `secret`'s
    value is never shown (--help, repr). `formerly`: the flag and environment variable a renamed setting had
    (either may be None), still read (with a warning naming the new ones) so that scripts and deployments keep
    working. `minimum`: the least value a number may take (None: any)."""
    return dataclasses.field(default=default, metadata={"env": env, "help": help, "secret": secret,
                                                        "formerly": formerly, "minimum": minimum},
                             repr=not secret)


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _boolean(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ValueError(f"not a boolean: use one of {', '.join(_TRUE)} or {', '.join(_FALSE)}")


class _DeprecatedFlag(argparse.Action):
    """A renamed setting's old flag: sets the new one, and says so."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        log.warning("%s is deprecated: use --%s", option_string, self.dest.replace("_", "-"))
        setattr(namespace, self.dest, values)


def _converter(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        convert = _converter(inner[0])
        return lambda text: None if text in ("", "none", "None") else convert(text)
    if annotation is bool:
        return _boolean
    if annotation in (int, float, str, Path):
        return annotation
    raise TypeError(f"unsupported settings type {annotation!r}")


def _fields(cls: type) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


def _env_default(field: dataclasses.Field, annotation: Any, environ: typing.Mapping[str, str]) -> Any:
    env = field.metadata.get("env")
    old_env = (field.metadata.get("formerly") or (None, None))[1]
    if env and env not in environ and old_env and old_env in environ:
        log.warning("%s is deprecated: use %s", old_env, env)
        env = old_env
    if env and env in environ:
        try:
            return _converter(annotation)(environ[env])
        except ValueError as error:
            raise SystemExit(f"environment variable {env}={environ[env]!r} ({_flag(field)}): {error}") from None
    return field.default


def _flag(field: dataclasses.Field) -> str:
    return "--" + field.name.replace("_", "-")


def _problem(field: dataclasses.Field, value: Any) -> str | None:
    """What is wrong with a setting's value, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return f"{value} is not a finite number"
    if (field.name == "port" or field.name.endswith("_port")) and not 1 <= value <= 65535:
        return f"{value} is not a port (1-65535)"
    minimum = field.metadata.get("minimum", 0)
    if minimum is not None and value < minimum:
        return f"{value} is below {minimum:g}"
    return None


def check_settings(settings: Any) -> list[str]:
    """Every problem of a settings object's values, each naming the flag and environment variable to change."""
    problems = []
    for field in dataclasses.fields(settings):
        problem = _problem(field, getattr(settings, field.name))
        if problem is not None:
            env = field.metadata.get("env")
            problems.append(f"{_flag(field)}{f' / {env}' if env else ''}: {problem}")
    return problems


def add_arguments(parser: argparse.ArgumentParser, cls: type,
                  environ: typing.Mapping[str, str] | None = None) -> None:
    """Add one `--flag` per field of the settings dataclass `cls`, defaulting to env/defaults."""
    environ = os.environ if environ is None else environ
    for field, annotation in _fields(cls):
        flag = _flag(field)
        default = _env_default(field, annotation, environ)
        env = field.metadata.get("env")
        help_text = field.metadata.get("help", "")
        help_text += f" [env {env}]" if env else ""
        if annotation is bool:
            parser.add_argument(flag, dest=field.name, default=default, help=help_text,
                                action=argparse.BooleanOptionalAction)
        else:
            # A secret's default prints as nothing; naming %(default) keeps ArgumentDefaultsHelpFormatter from adding it.
            shown = "%(default).0s" if field.metadata.get("secret") else " (default: %(default)s)"
            parser.add_argument(flag, dest=field.name, default=default, help=help_text + shown,
                                type=_converter(annotation), metavar=field.name.upper())
            if field.metadata.get("formerly") and field.metadata["formerly"][0]:
                parser.add_argument(field.metadata["formerly"][0], dest=field.name, default=default,
                                    type=_converter(annotation), action=_DeprecatedFlag, help=argparse.SUPPRESS)


def from_namespace(cls: type[T], namespace: argparse.Namespace,
                   parser: argparse.ArgumentParser | None = None) -> T:
    """Build the settings dataclass from parsed arguments, ignoring unrelated ones; a value out of its range
    ends the process with every such problem named (`check_settings`): through `parser`'s usage error when
    given."""
    settings = cls(**{f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)})
    problems = check_settings(settings)
    if problems:
        message = "invalid settings:\n  " + "\n  ".join(problems)
        if parser is not None:
            parser.error(message)
        raise SystemExit(message)
    return settings


def load_settings(cls: type[T], argv: Sequence[str] | None = None, *, prog: str | None = None,
                  description: str | None = None, environ: typing.Mapping[str, str] | None = None) -> T:
    """Parse `argv` (default: sys.argv[1:]) into the settings dataclass `cls`."""
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(parser, cls, environ)
    return from_namespace(cls, parser.parse_args(argv), parser)


def _kafka_default() -> str:
    return f"127.0.0.1:{os.environ.get('KAFKA_PORT', '9092')}"


# The topic machines publish their states to, and the stream connector subscribes to.
MACHINE_STATES_TOPIC = "machine/states"


@dataclasses.dataclass(frozen=True)
class MqttSettings:
    """Where the MQTT broker is."""

    mqtt_host: str = setting("127.0.0.1", "MQTT_HOST", "MQTT broker host")
    mqtt_port: int = setting(1883, "MQTT_PORT", "MQTT broker port")
    mqtt_username: str | None = setting(None, "MQTT_USERNAME", "MQTT user name, if the broker requires one")
    mqtt_password: str | None = setting(None, "MQTT_PASSWORD", "MQTT password (set it in the environment or the "
                                        "credentials file, not as a flag)", secret=True)
    mqtt_tls_ca_file: Path | None = setting(None, "MQTT_TLS_CA_FILE",
                                           "CA certificate (PEM) to verify the broker by: connects with TLS when set")


# How long a stage's start-up asks Kafka again while it answers a transient error (kafka_clients.retry_transient).
DEFAULT_STARTUP_DEADLINE_S = 120.0


@dataclasses.dataclass(frozen=True)
class KafkaSettings:
    """Where Kafka is."""

    kafka_bootstrap_servers: str = setting(_kafka_default(), "KAFKA_BOOTSTRAP_SERVERS",
                                           "Kafka bootstrap servers, host:port[,host:port]")
    kafka_startup_deadline_s: float = setting(DEFAULT_STARTUP_DEADLINE_S, "KAFKA_STARTUP_DEADLINE_S",
                                              "seconds the start-up asks Kafka again while it answers a transient "
                                              "error (starting, no coordinator or leader yet, unreachable)")
    # Who the process is on Kafka. A secure stack's entry points fill these from the credentials file
    # (pipeline_core.credentials.environ_for); `kafka_clients.security_config` turns them into client settings.
    kafka_security_protocol: str = setting("PLAINTEXT", "KAFKA_SECURITY_PROTOCOL",
                                           "PLAINTEXT, SASL_PLAINTEXT or SASL_SSL")
    kafka_sasl_mechanism: str = setting("SCRAM-SHA-512", "KAFKA_SASL_MECHANISM", "SASL mechanism (SASL_* only)")
    kafka_sasl_username: str | None = setting(None, "KAFKA_SASL_USERNAME", "Kafka SASL user (SASL_* only)")
    kafka_sasl_password: str | None = setting(None, "KAFKA_SASL_PASSWORD",
                                              "Kafka SASL password (SASL_* only; set it in the environment or "
                                              "the credentials file, not as a flag)", secret=True)
    kafka_ssl_ca_location: str | None = setting(None, "KAFKA_SSL_CA_LOCATION",
                                                "PEM file of the CA that signed the brokers' certificates (SASL_SSL)")


@dataclasses.dataclass(frozen=True)
class InfluxSettings:
    """Where InfluxDB is, and which database the pipeline writes."""

    influxdb_host: str = setting("127.0.0.1", "INFLUXDB_HOST", "InfluxDB host")
    influxdb_port: int = setting(8086, "INFLUXDB_PORT", "InfluxDB HTTP port")
    influxdb_database: str = setting("machinedata", "INFLUXDB_DATABASE", "InfluxDB database")
    influxdb_username: str | None = setting(None, "INFLUXDB_USERNAME", "InfluxDB user, when auth is on")
    influxdb_password: str | None = setting(None, "INFLUXDB_PASSWORD", "InfluxDB password (set it in the "
                                            "environment or the credentials file, not as a flag)", secret=True)
    influxdb_tls_ca_file: Path | None = setting(None, "INFLUXDB_TLS_CA_FILE",
                                                "CA certificate (PEM) to verify InfluxDB by: connects with HTTPS "
                                                "when set")


@dataclasses.dataclass(frozen=True)
class ProgressSettings(InfluxSettings):
    """How a long-running stage reports its progress (`pipeline_core.progress`): a log line and, in the
    pipeline's InfluxDB, one `pipeline_health` point per interval."""

    progress_interval_s: float = setting(10.0, "PROGRESS_INTERVAL_S",
                                         "seconds between progress log lines and health points")
    health_metrics: bool = setting(True, "HEALTH_METRICS",
                                   "write the health metrics to InfluxDB (measurement pipeline_health)")
    progress_file: Path | None = setting(None, "PROGRESS_FILE",
                                         "heartbeat file written at each progress report, read by `make status` and "
                                         "the healthcheck (pipeline_core.stage_health); none when unset")
    wedge_on_sigusr2: bool = setting(False, "PIPELINE_WEDGE_ON_SIGUSR2",
                                     "fault injection for tests of supervision: on SIGUSR2 the stage's loop blocks "
                                     "for good in a read that never returns, the process alive (pipeline_core.wedge)")


@dataclasses.dataclass(frozen=True)
class ConnectionSettings(MqttSettings, KafkaSettings, InfluxSettings):
    """Where all of the pipeline's servers are. A stage's settings inherit only the parts it uses
    (MqttSettings, KafkaSettings, InfluxSettings), so its --help lists only what matters to it."""
