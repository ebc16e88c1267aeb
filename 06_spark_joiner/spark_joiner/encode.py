"""The output records' Kafka key, id and JSON value, as Spark column expressions.

The processor emits each output record as its fields; this turns them into the bytes the sink produces,
in the JVM, column by column: no Python object per record. The records are those the standalone joiner
writes (`local_stream_buffer.output`), field for field:

- the id is the same UUID5: SHA-1 over the id namespace and the name "thing/quantity/left/right", with
  the times written by `output.id_time_text` (whole ms as integers, else three decimals);
- whole-ms times are JSON integers and the output time of two whole-ms times ends in ".5" or is whole,
  as Python writes them; any other number is written by the JVM (e.g. ``1.0E-5``), which reads back as
  the same float64.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from local_stream_buffer.output import OUTPUT_ID_NAMESPACE

from .processor import DLQ

_NAMESPACE_HEX = OUTPUT_ID_NAMESPACE.hex


def id_time_text(time_ms: Column) -> Column:
    """`local_stream_buffer.output.id_time_text`: the same integer arithmetic on microseconds."""
    micros = F.floor(time_ms * F.lit(1000.0) + F.lit(0.5))
    millis, fraction = F.floor(micros / 1000), micros % 1000
    return F.when(fraction == 0, millis.cast("string")).otherwise(
        F.concat(millis.cast("string"), F.lit("."), F.lpad(fraction.cast("string"), 3, "0")))


def output_id(thing: Column, quantity: Column, left_time: Column, right_time: Column) -> Column:
    """`local_stream_buffer.output.output_id`: UUID5 (RFC 4122) of the name in the output id namespace."""
    name = F.concat_ws("/", thing, quantity, id_time_text(left_time), id_time_text(right_time))
    digest = F.sha1(F.concat(F.unhex(F.lit(_NAMESPACE_HEX)), F.encode(name, "UTF-8")))
    # Version 5 in the 13th hex digit; the variant's top bits 10 in the 17th.
    variant = F.lower(F.hex(F.conv(F.substring(digest, 17, 1), 16, 10).cast("int").bitwiseAND(3).bitwiseOR(8)))
    return F.concat(F.substring(digest, 1, 8), F.lit("-"), F.substring(digest, 9, 4), F.lit("-5"),
                    F.substring(digest, 14, 3), F.lit("-"), variant, F.substring(digest, 18, 3), F.lit("-"),
                    F.substring(digest, 21, 12))


def time_json(time_ms: Column) -> Column:
    """A time as Python's JSON writes the engine's times: an integer when whole, k.5 as such."""
    whole = F.floor(time_ms)
    return (F.when(time_ms == whole, whole.cast("string"))
            .when(time_ms - whole == 0.5, F.concat(whole.cast("string"), F.lit(".5")))
            .otherwise(time_ms.cast("string")))


def _object_start(**fields: Column) -> Column:
    """``{"name":"value",...`` of string fields (JSON-escaped by the JVM), left open for more fields."""
    text = F.to_json(F.struct(*(column.alias(name) for name, column in fields.items())))
    return text.substr(F.lit(1), F.length(text) - 1)


def record_json(rows: DataFrame) -> Column:
    """The JSON text of each output row's record."""
    c = rows  # the columns, by name
    left, right = c["left_time"], c["right_time"]
    return F.concat(
        _object_start(thing=c["thing"], quantity=c["quantity"]),
        F.lit(',"phenomenonTime":'), time_json((left + right) / 2),
        F.lit(',"result":'), c["result"].cast("string"),
        F.lit(',"left":'), _object_start(quantity=c["left_quantity"]),
        F.lit(',"phenomenonTime":'), time_json(left), F.lit(',"result":'), c["left_result"].cast("string"),
        F.lit('},"right":'), _object_start(quantity=c["right_quantity"]),
        F.lit(',"phenomenonTime":'), time_json(right), F.lit(',"result":'), c["right_result"].cast("string"),
        F.lit('},"case":"'), c["case"],
        F.lit('","id":"'), output_id(c["thing"], c["quantity"], left, right), F.lit('"}'),
    )


def kafka_records(rows: DataFrame) -> DataFrame:
    """The processor's rows as the sink's (kind, key, value): an output record's key and JSON value; a dead
    letter's envelope as it is."""
    is_dead_letter = rows["kind"] == DLQ
    return rows.select(
        rows["kind"],
        F.when(is_dead_letter, F.lit(None)).otherwise(F.concat(rows["thing"], F.lit("."), rows["quantity"]))
        .alias("key"),
        F.when(is_dead_letter, rows["dead_letter"]).otherwise(F.encode(record_json(rows), "UTF-8")).alias("value"),
    )
