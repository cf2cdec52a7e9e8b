"""Corpus sources as Spark DataFrames of records (the input of :func:`ingest.spark.records.parse_records`).

Every DataFrame has the order columns ``o1, o2, o3`` (int64), which sort records into the
order the single-node reader meets them (file, then position in the file), so that
``--limit N`` keeps the same first N documents, plus the source's payload column:

    sharegpt  the file (one JSON array) read whole and streamed by ijson in one task
              (:func:`ingest.spark.records.split_json_arrays`), as the single-node reader streams it,
              so a cut-off file keeps every complete record (Spark's own JSON reader would turn it
              into one corrupt record); its records are then spread over ``partitions``.
    code      the file list of :func:`ingest.sources.list_files` (same glob, same site-packages
              rule); the workers read each file.
    jsonl     Spark's text reader (lines as bytes), splittable.
    parquet   Spark's Parquet reader (the text column), splittable.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlparse

from ..sources import SourceError, list_files
from .records import ELEMENT_DDL, split_json_arrays


def _with_order(df, spark, files: list[Path]):
    """Add ``o1`` (the file's index in ``files``), ``o2`` (the split's start byte), ``o3`` (row id)."""
    from pyspark.sql import functions as F

    index = {str(p.resolve()): i for i, p in enumerate(files)}
    names: dict[str, int] = {}
    for uri in df.inputFiles():  # Hadoop spells a local file file:///x here and file:/x in _metadata
        i = index.get(str(Path(unquote(urlparse(uri).path)).resolve()), len(files))
        path_part = uri.split(":", 1)[1].lstrip("/")
        for spelling in (uri, f"file:/{path_part}", f"file:///{path_part}"):
            names[spelling] = i
    lookup = spark.createDataFrame(list(names.items()), "file_uri string, o1 long")
    df = df.select("*", F.col("_metadata.file_path").alias("file_uri"), F.col("_metadata.file_block_start").alias("o2"),
                   F.monotonically_increasing_id().alias("o3"))
    df = df.join(F.broadcast(lookup), "file_uri", "left").drop("file_uri")
    return df.withColumn("o1", F.coalesce(F.col("o1"), F.lit(len(files)).cast("long")))


def read_records(spark, source: str, paths: tuple[Path, ...], *, glob: str, text_field: str, partitions: int):
    """A DataFrame of the source's records (see the module docstring for its columns).

    Args:
        spark: the session. source: ``sharegpt``, ``code``, ``jsonl`` or ``parquet``.
        paths: resolved paths (:func:`ingest.sources.resolve_paths`).
        glob / text_field: as in :func:`ingest.sources.iter_documents`.
        partitions: how many partitions one-split sources (sharegpt, code) are spread over.

    Raises:
        SourceError: when nothing matches, or the Parquet text column is missing or not text.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if source == "sharegpt":
        df = spark.read.format("binaryFile").load(str(paths[0])).select(F.lit(0).cast("long").alias("o1"), "content")
        return df.mapInArrow(split_json_arrays, ELEMENT_DDL).repartition(partitions)
    if source == "code":
        files = list_files(paths, (glob,))
        rows = [(i, 0, 0, str(p)) for i, p in enumerate(files)]
        return spark.createDataFrame(rows, "o1 long, o2 long, o3 long, path string").repartition(partitions)
    if source == "jsonl":
        files = list_files((paths[0],), ("**/*.jsonl", "**/*.json"))
        df = spark.read.text([str(p) for p in files])
        df = _with_order(df, spark, files)
        return df.select("o1", "o2", "o3", F.col("value").cast("binary").alias("value"))
    files = list_files((paths[0],), ("**/*.parquet",))
    df = spark.read.parquet(*[str(p) for p in files])
    if text_field not in df.columns:
        raise SourceError(f"{paths[0]} has no column {text_field!r} (columns: {df.columns}); set --text-field")
    kind = df.schema[text_field].dataType
    if not isinstance(kind, (T.StringType, T.BinaryType)):
        raise SourceError(f"{paths[0]}: column {text_field!r} is {kind.simpleString()}, not text")
    df = _with_order(df.select(text_field), spark, files)
    return df.select("o1", "o2", "o3", F.col(text_field).alias("value"))
