"""Starting and stopping the Spark session of a build (``--engine spark``).

The build runs on any Spark master: ``local[*]`` (the default, every core of this machine),
``local[2]``, ``spark://host:7077``, ``yarn`` or ``k8s://...``. Settings pass through as
``--spark-conf KEY=VALUE``, the ``spark-submit --conf`` a Spark user already knows. On a
cluster the executors need this package, its tokenizer and the corpus path (shared storage).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MIN_JAVA = 17
_LOCAL_DEFAULTS = {"spark.driver.memory": "6g",  # local masters run every executor inside the driver JVM
                   "spark.sql.shuffle.partitions": "32"}
_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.adaptive.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.shuffle.compress": "true",
}
_LOG4J = """rootLogger.level = error
rootLogger.appenderRef.console.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
"""


class SparkUnavailable(RuntimeError):
    """Raised when ``--engine spark`` cannot start: pyspark or Java 17+ is missing."""


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def spark_problem() -> str | None:
    """Why ``--engine spark`` cannot run here (pyspark or Java 17+ missing), or ``None`` when it can."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed: pip install 'crest-spec[spark]' (or use --engine duckdb)"
    java = _java()
    if java is None:
        return (f"Spark needs Java {MIN_JAVA}+: install a JDK and put java on PATH or set JAVA_HOME "
                "(or use --engine duckdb)")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{java} -version failed ({exc}); Spark needs Java {MIN_JAVA}+"
    m = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(m.group(1)) if m else 0
    if major == 1 and m and m.group(2):
        major = int(m.group(2))  # "1.8.0" is Java 8
    if major < MIN_JAVA:
        return f"{java} is Java {major or '?'}; Spark 4 needs Java {MIN_JAVA}+ (set JAVA_HOME to a newer JDK)"
    return None


def _start(builder, log: Path):
    """Start the session with the JVM's stdout and stderr sent to ``log``: the JVM prints notices there
    that no log level reaches (Spark 4's ``Using incubator modules``, the JVM's own warnings), and they
    must not mix with the build's output (``--json``). Errors still reach Python as exceptions."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
        try:
            return builder.getOrCreate()
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


@contextlib.contextmanager
def spark_session(master: str, conf: dict[str, str], workdir: Path) -> Iterator[SparkSession]:
    """A Spark session for one build, stopped on exit.

    Args:
        master: the Spark master URL (``local[*]``, ``spark://host:7077``, ``yarn``, ...).
        conf: extra Spark settings; they override this module's defaults.
        workdir: scratch space (Spark's local dir and its quiet log4j2 configuration).

    Raises:
        SparkUnavailable: when pyspark or Java 17+ is missing, or a session is already running in
            this process (a build owns its session: it sets the driver's memory and logging).
    """
    problem = spark_problem()
    if problem:
        raise SparkUnavailable(problem)
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        raise SparkUnavailable("a Spark session is already running in this process; stop it before the build")
    conf_dir = Path(workdir) / "conf"
    conf_dir.mkdir(exist_ok=True)
    log4j = conf_dir / "log4j2.properties"
    log4j.write_text(_LOG4J)
    java_opts = f"-Dlog4j2.configurationFile={log4j.as_uri()}"
    # this process's environment is never written: the Python the workers run and their environment are settings
    settings = {"spark.executorEnv.TOKENIZERS_PARALLELISM": "true", **_DEFAULTS}
    if master.startswith("local"):
        settings.update(_LOCAL_DEFAULTS)
        settings["spark.driver.host"] = "127.0.0.1"
        settings["spark.driver.bindAddress"] = "127.0.0.1"
        settings["spark.local.dir"] = str(workdir)
    settings.update(conf)
    for side in ("driver", "executor"):
        key = f"spark.{side}.extraJavaOptions"
        settings[key] = f"{settings[key]} {java_opts}" if key in settings else java_opts
    builder = SparkSession.builder.master(master).appName("crest-ingest")
    for key, value in settings.items():
        builder = builder.config(key, value)
    log = Path(workdir) / "spark-jvm.log"
    try:
        spark = _start(builder, log)
    except Exception as exc:  # py4j / pyspark errors: a bad master URL or setting, a JVM that cannot start
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        jvm = [line for line in log.read_text(errors="replace").splitlines() if "Exception" in line or "Error" in line]
        detail = f"{detail} ({jvm[0].strip()})" if jvm else detail
        raise SparkUnavailable(f"cannot start Spark with --spark-master {master!r}: {detail}; check the master URL "
                               f"and the --spark-conf settings") from exc
    spark.sparkContext.setLogLevel("ERROR")
    spark.sparkContext.pythonExec = sys.executable  # the workers run this interpreter (PySpark's default: python3)
    try:
        yield spark
    finally:
        spark.stop()
