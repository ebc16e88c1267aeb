"""One joiner at a time: which joiner the state dir's stack runs, and the switch from one to the other.

Both joiners write exactly once, each by its own record of what it has joined: the standalone joiner commits its
input position in its consumer group with every transaction and keeps its state in a changelog topic; the Spark
joiner commits its input position in the sink's group (named like its transactional id) and keeps its state in its
checkpoint. Started beside the other, or after it, a joiner knows nothing of what the other wrote and joins the
input again from its beginning: every join twice.

So `up` with another JOINER stops the running joiner first and hands its position over (`hand_over`): the new
joiner's group gets the old one's committed input offsets and its own state is dropped (the standalone joiner's
changelog topic, the Spark joiner's checkpoint). Each joiner, finding committed offsets and no state, rebuilds its
state from the input up to them with the outputs suppressed (they are in machine.out already) and joins on from
there (05_local_stream_buffer and 06_spark_joiner READMEs, "rebuild"), so machine.out is as one joiner would have
written it. The state dir records the joiner (`.stack/joiner`), so `up`, `status` and `logs` without JOINER act on
the one that runs, and a switch made while the stack was down is handed over too.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline_core import paths
from pipeline_core.spec_starts import SPECS_PART
from pipeline_core.topics import stage_topics
from .processes import StackError

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

log = logging.getLogger(__name__)

DEFAULT_JOINER = "spark"
JOINER_NAMES = ("lsb", "spark")
# How long the handover waits for a group's members to be gone (a static member stays its session timeout, 10 s
# by default, after its process stopped) and for a deleted topic to be gone.
GROUP_EMPTY_DEADLINE_S = 60.0
TOPIC_DELETED_DEADLINE_S = 60.0
REQUEST_TIMEOUT_S = 30.0


def _record() -> Path:
    return paths.STATE_DIR / "joiner"


def recorded() -> str | None:
    """The joiner this state dir's stack last ran (or was switched to), if any."""
    try:
        return _record().read_text().strip() or None
    except FileNotFoundError:
        return None


def record(joiner: str) -> None:
    _record().parent.mkdir(parents=True, exist_ok=True)
    _record().write_text(joiner + "\n")


def chosen() -> str:
    """JOINER from the environment, else the one the state dir runs, else the default (spark)."""
    joiner = os.environ.get("JOINER") or recorded() or DEFAULT_JOINER
    if joiner not in JOINER_NAMES:
        raise StackError(f"JOINER={joiner!r}: choose one of {', '.join(JOINER_NAMES)}")
    return joiner


@dataclass(frozen=True)
class JoinerPosition:
    """Where a joiner keeps what it has joined: the group holding its committed input offsets, and its state."""

    joiner: str
    group_id: str
    input_topic: str
    state_topic: str | None = None  # the standalone joiner's changelog
    checkpoint_dir: Path | None = None  # the Spark joiner's

    def drop_state(self, admin: AdminClient) -> None:
        """Delete the joiner's state, so that it rebuilds it from the input up to its committed offsets."""
        if self.checkpoint_dir is not None and self.checkpoint_dir.exists():
            shutil.rmtree(self.checkpoint_dir)
        if self.state_topic is not None:
            _delete_topic(admin, self.state_topic)


def position_of(joiner: str, cluster: bool) -> JoinerPosition:
    """Where `joiner` keeps its position on this stack: the names each joiner derives from its settings (the
    defaults, or the environment variables the stack passes on), as `kafka_joiner.settings` and
    `spark_joiner.settings` derive them."""
    if joiner == "lsb":
        group = os.environ.get("KAFKA_JOINER_GROUP_ID") or "kafka-joiner"
        topic = stage_topics("lsb-joiner")["data"]
        # Every instance the stack runs joins its input where it lies (--input-partitioned-by-thing).
        state_topic = os.environ.get("KAFKA_JOINER_STATE_TOPIC") or f"{group}.{topic}.state"
        return JoinerPosition(joiner, group, topic, state_topic=state_topic)
    if joiner == "spark":
        # The cluster's joiner is given its checkpoint on its command line (topology.SparkSubmittedJoiner).
        default = paths.STATE_DIR / "spark_joiner" / "checkpoint"  # spark_joiner.settings.DEFAULT_CHECKPOINT_DIR
        checkpoint = (paths.STATE_DIR / "spark-joiner" / "checkpoint" if cluster else
                      Path(os.environ.get("SPARK_JOINER_CHECKPOINT_DIR") or default))
        digest = hashlib.sha1(str(checkpoint.resolve()).encode()).hexdigest()[:12]
        group = os.environ.get("SPARK_JOINER_TRANSACTIONAL_ID") or f"spark-joiner.{digest}"
        topic = stage_topics("spark-joiner")["data"]
        return JoinerPosition(joiner, group, topic, checkpoint_dir=checkpoint)
    raise StackError(f"JOINER={joiner!r}: choose one of {', '.join(JOINER_NAMES)}")


def connector_environment(cluster: bool) -> dict[str, str]:
    """What the stream connector is told of the joiners: both joiners' groups, whose positions it waits for before it
    places records by a grown machine.data's new partition count (one runs; the other's group holds no position,
    as a switch hands it over and deletes it)."""
    return {"STREAM_CONNECTOR_JOINER_GROUPS": ",".join(position_of(joiner, cluster).group_id
                                                       for joiner in JOINER_NAMES)}


def hand_over(previous: str, joiner: str, bootstrap_servers: str, security: dict[str, str], cluster: bool) -> str:
    """Give `joiner` the input position `previous` committed (both stopped): its group's committed offsets become
    the previous joiner's, and its state is dropped, to be rebuilt from the input. Returns what was done, in a line."""
    from pipeline_core.kafka_clients import admin_client
    old, new = position_of(previous, cluster), position_of(joiner, cluster)
    if old.input_topic != new.input_topic:
        raise StackError(f"the {previous} joiner reads {old.input_topic}, the {joiner} joiner {new.input_topic}: "
                         "a switch hands over a position in one topic; give both the same input topic")
    offsets = committed_offsets(bootstrap_servers, security, old.group_id, old.input_topic)
    # Where each join spec started per partition goes with the offsets (pipeline_core.spec_starts): the new joiner's
    # rebuild keeps a spec added on the running stack from the records before its start.
    starts = spec_starts(bootstrap_servers, security, old.group_id, old.input_topic)
    admin = admin_client(bootstrap_servers, **security)
    stale = committed_offsets(bootstrap_servers, security, new.group_id, new.input_topic)
    if set(stale) - set(offsets):  # positions the handover would not replace (the previous group was deleted)
        _delete_group(admin, new.group_id)
    new.drop_state(admin)
    if offsets:
        _commit(bootstrap_servers, security, new.group_id, new.input_topic, offsets, starts)
        # Its position lives on in the new joiner's group: left behind, it would stand still, and the stream connector
        # would wait for it to read on before placing by a grown topic's new count.
        _delete_group(admin, old.group_id)
    where = (", ".join(f"{partition}: {offset:,}" for partition, offset in sorted(offsets.items()))
             if offsets else "nothing joined yet")
    summary = (f"{previous} joiner -> {joiner} joiner: {old.input_topic} handed over at the offsets the {previous} "
               f"joiner committed ({where}); the {joiner} joiner rebuilds its state up to them, then joins on")
    log.info("%s", summary)
    return summary


def only_one_with_a_position(bootstrap_servers: str, security: dict[str, str], cluster: bool) -> str | None:
    """For a state dir that recorded no joiner (a stack from before the record): the one joiner whose group
    holds committed input offsets, if only one does; it ran, and a switch takes over from it."""
    with_position = [joiner for joiner in JOINER_NAMES
                     if committed_offsets(bootstrap_servers, security, position_of(joiner, cluster).group_id,
                                          position_of(joiner, cluster).input_topic)]
    return with_position[0] if len(with_position) == 1 else None


def _group_client(bootstrap_servers: str, security: dict[str, str], group_id: str):  # -> confluent_kafka.Consumer
    """A consumer of `group_id` that joins no group: it reads and commits the group's offsets only (the admin
    client's offset requests crash librdkafka 2.16 on a broker without __consumer_offsets yet)."""
    from confluent_kafka import Consumer
    from pipeline_core.kafka_clients import consumer_config
    return Consumer(consumer_config(bootstrap_servers, group_id, **security, log_level=0))


def committed_offsets(bootstrap_servers: str, security: dict[str, str], group_id: str, topic: str) -> dict[int, int]:
    """Partition -> the offset `group_id` committed in `topic` (partitions without a commit left out; none while
    the topic does not exist)."""
    return {partition: offset for partition, (offset, _) in _committed(bootstrap_servers, security, group_id,
                                                                       topic).items()}


def spec_starts(bootstrap_servers: str, security: dict[str, str], group_id: str, topic: str) -> dict[int, str]:
    """Partition -> the part of `group_id`'s commit metadata that names where each join spec started there
    (`pipeline_core.spec_starts`), where it names that."""
    found = {}
    for partition, (_, metadata) in _committed(bootstrap_servers, security, group_id, topic).items():
        part = next((part for part in (metadata or "").split(";") if part.strip().startswith(SPECS_PART)), None)
        if part is not None:
            found[partition] = part.strip()
    return found


def _committed(bootstrap_servers: str, security: dict[str, str], group_id: str,
               topic: str) -> dict[int, tuple[int, str | None]]:
    """Partition -> (offset, metadata) `group_id` committed in `topic`."""
    from confluent_kafka import TopicPartition
    from pipeline_core.kafka_clients import raise_partition_errors, retry_transient
    client = _group_client(bootstrap_servers, security, group_id)
    try:
        metadata = client.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return {}
        partitions = [TopicPartition(topic, partition) for partition in sorted(metadata.partitions)]
        committed = retry_transient(lambda: raise_partition_errors(client.committed(partitions,
                                                                                    timeout=REQUEST_TIMEOUT_S)),
                                    what=f"reading the committed offsets of group {group_id}")
        return {position.partition: (position.offset, position.metadata) for position in committed
                if position.offset >= 0}
    finally:
        client.close()


def _commit(bootstrap_servers: str, security: dict[str, str], group_id: str, topic: str,
            offsets: dict[int, int], metadata: dict[int, str] | None = None) -> None:
    """Commit `offsets` (with `metadata` where given) as `group_id`'s, once the group has no member left (a stopped
    joiner's static membership lasts its session timeout, and Kafka refuses a commit from outside a group with
    members)."""
    from confluent_kafka import KafkaException, TopicPartition
    from pipeline_core.kafka_clients import raise_partition_errors
    metadata = metadata or {}
    positions = [TopicPartition(topic, partition, offset, metadata[partition]) if partition in metadata else
                 TopicPartition(topic, partition, offset) for partition, offset in sorted(offsets.items())]
    client = _group_client(bootstrap_servers, security, group_id)
    end = time.monotonic() + GROUP_EMPTY_DEADLINE_S
    try:
        while True:
            try:
                raise_partition_errors(client.commit(offsets=positions, asynchronous=False) or [])
                return
            except KafkaException as error:
                if time.monotonic() > end:
                    raise StackError(f"committing the handed-over offsets for group {group_id} failed for "
                                     f"{GROUP_EMPTY_DEADLINE_S:g} s ({error.args[0]}): does a joiner of that group "
                                     "run elsewhere? Stop it, then `make up`") from None
                time.sleep(0.5)
    finally:
        client.close()


def _delete_group(admin: AdminClient, group_id: str) -> None:
    from confluent_kafka import KafkaError, KafkaException
    end = time.monotonic() + GROUP_EMPTY_DEADLINE_S
    while True:
        (future,) = admin.delete_consumer_groups([group_id], request_timeout=REQUEST_TIMEOUT_S).values()
        try:
            future.result()
            return
        except KafkaException as error:
            if error.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return
            if time.monotonic() > end:
                raise StackError(f"deleting consumer group {group_id} failed for {GROUP_EMPTY_DEADLINE_S:g} s "
                                 f"({error.args[0]}): does a joiner of that group run elsewhere?") from None
            time.sleep(0.5)


def _delete_topic(admin: AdminClient, topic: str) -> None:
    """Delete `topic` if it exists, and wait until the brokers no longer list it (the joiner creates it anew)."""
    from confluent_kafka import KafkaError, KafkaException
    if topic not in admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics:
        return
    (future,) = admin.delete_topics([topic], operation_timeout=REQUEST_TIMEOUT_S).values()
    try:
        future.result()
    except KafkaException as error:
        if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise
    end = time.monotonic() + TOPIC_DELETED_DEADLINE_S
    while topic in admin.list_topics(timeout=REQUEST_TIMEOUT_S).topics:
        if time.monotonic() > end:
            raise StackError(f"topic {topic} was deleted but is still listed after {TOPIC_DELETED_DEADLINE_S:g} s")
        time.sleep(0.2)
