"""The CREST build on Apache Spark (``python -m ingest build --engine spark``), for corpora beyond one host.

The job runs the single-node build's stages as Spark stages and calls the same per-record checks,
tokenizer call, tree builder and codec from Arrow UDFs, so on the same corpus and parameters it
stores the same rows, blob for blob (see :mod:`ingest.spark.job` and ``docs/spark-ingest.md``).
"""

from .job import build_with_spark
from .session import SparkUnavailable, spark_problem

__all__ = ["build_with_spark", "SparkUnavailable", "spark_problem"]
