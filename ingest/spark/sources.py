"""Corpus sources as Spark DataFrames of records (the input of :func:`ingest.spark.records.parse_records`).

Every DataFrame has the order columns ``o1, o2, o3`` (int64), which sort records into the order the single-node reader
meets them (file, then position in the file), so that ``--limit N`` keeps the same first N documents, plus the source's
payload column:

- ``sharegpt``: the file read whole and streamed by ijson in one task (:func:`ingest.spark.records.split_json_arrays`),
  so a cut-off file keeps every complete record; the records are then spread over ``partitions``;
- ``code``: the file list of :func:`ingest.files.list_files`; the workers read each file;
- ``jsonl``: Spark's text reader, splittable; plain files only (``.gz`` / ``.zst``: ``--engine duckdb``);
- ``parquet``: Spark's Parquet reader (the text column), splittable;
- ``chat``: each file of :func:`ingest.files.list_files` read in a task by the single-node reader
  (:func:`ingest.spark.records.split_chat_files`), its records spread over ``partitions``; the workers must see the
  files at the same paths, as for ``code``.
"""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import unquote, urlparse

from ..chat_files import chat_column
from ..errors import SourceError
from ..files import CHAT_PATTERNS, COMPRESSED, JSONL_PATTERNS, list_files
from .records import CHAT_DDL, ELEMENT_DDL, split_chat_files, split_json_arrays


def _refuse_compressed(source: str, files: list[Path]) -> None:
    """``--engine spark`` reads sharegpt and jsonl files with Spark's own readers, which cannot recover a damaged
    compressed file as the single-node reader does: a compressed one is refused, naming the fix."""
    for file in files:
        if file.name.endswith(COMPRESSED):
            other = " or --source chat" if source == "sharegpt" else ""
            raise SourceError(f"--engine spark reads --source {source} files uncompressed; {file} is compressed: "
                              f"use --engine duckdb{other}, or decompress it")


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


def read_records(spark, source: str, paths: tuple[Path, ...], *, glob: str, text_field: str, partitions: int,
                 chat_field: str | None = None):
    """A DataFrame of the source's records (see the module docstring for its columns).

    Args:
        spark: the session. source: ``sharegpt``, ``code``, ``jsonl``, ``parquet`` or ``chat``.
        paths: resolved paths (:func:`ingest.sources.resolve_paths`).
        glob / text_field / chat_field: as in :func:`ingest.sources.iter_documents`.
        partitions: how many partitions one-split sources (sharegpt, code, chat) are spread over.

    Returns:
        The DataFrame (lazy: nothing is read yet but file lists and Parquet schemas).

    Raises:
        SourceError: when nothing matches, the Parquet text (or chat) column is missing or of the wrong type,
            or a sharegpt or jsonl file is compressed.
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if source == "chat":
        files = list_files(paths, CHAT_PATTERNS)
        for file in files:  # refused here, before any task runs, as the single-node reader refuses it first
            if file.name.endswith(".parquet"):
                chat_column(file, chat_field)
        listing = [(i, str(p)) for i, p in enumerate(files)]
        df = spark.createDataFrame(listing, "o1 long, path string").repartition(max(1, min(len(files), partitions)))
        split = functools.partial(split_chat_files, chat_field=chat_field)
        return df.mapInArrow(split, CHAT_DDL).repartition(partitions)
    if source == "sharegpt":
        _refuse_compressed(source, [paths[0]])
        df = spark.read.format("binaryFile").load(str(paths[0])).select(F.lit(0).cast("long").alias("o1"), "content")
        return df.mapInArrow(split_json_arrays, ELEMENT_DDL).repartition(partitions)
    if source == "code":
        files = list_files(paths, (glob,))
        rows = [(i, 0, 0, str(p)) for i, p in enumerate(files)]
        return spark.createDataFrame(rows, "o1 long, o2 long, o3 long, path string").repartition(partitions)
    if source == "jsonl":
        files = list_files((paths[0],), JSONL_PATTERNS)
        _refuse_compressed(source, files)
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
